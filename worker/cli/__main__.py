"""`python -m worker.cli`: the same as the `reactq` command."""

from . import main

main()
