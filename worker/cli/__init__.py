"""The `reactq` command line (click, rich): one module per verb group, the terminal display, the demo
and the local stack it starts. The top layer: it may import every package below it."""

from __future__ import annotations


def main() -> None:
    """The `reactq` entry point (pyproject's `worker.cli:main`); the verbs load on first call. The collector
    is off until the verb is resolved (worker/cli/collector.py)."""
    from .collector import start

    start()
    from .main import main as run

    run()
