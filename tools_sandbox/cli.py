"""`python -m tools_sandbox.cli ...` (scripts/build-sandbox-image.sh, deploy/sandbox/, old scripts): an
alias of the sandbox command line, which lives in tools_sandbox/edges/cli.py."""

from .edges.cli import sandbox

__all__ = ["sandbox"]

if __name__ == "__main__":
    sandbox()
