"""`python -m worker.cli`: the same as the `reactq` command."""

from .main import main

main()
