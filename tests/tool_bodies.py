"""Tool functions that misbehave, for tests/test_tool_deadlines.py and bench/tool_isolation.py. Module-level
(a process-isolated tool's function is sent to its process by reference); `tests/hostile_tools.py`
registers them, so that importing this module registers nothing.

`spin` and `hang` first touch a file named after themselves in $REACTQ_TEST_MARKERS (when set), so a
test knows the call has started."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pydantic import BaseModel

from worker.errors import ToolError


class Input(BaseModel):
    input: str = ""


def _started(name: str) -> None:
    if markers := os.environ.get("REACTQ_TEST_MARKERS"):
        Path(markers, name).touch()


def spin(args: Input) -> str:
    """One C call that holds the GIL for hours: a thread running it could not be stopped."""
    _started("spin")
    return str(sum(range(10**14)))


def hang(args: Input) -> str:
    """A call that never answers (a network call without a timeout)."""
    _started("hang")
    threading.Event().wait()
    return "never"


def echo(args: Input) -> str:
    return f"echo {args.input}"


def pid(args: Input) -> str:
    return str(os.getpid())


def fail(args: Input) -> str:
    raise ToolError(f"nothing known about {args.input!r}", "not_found")


def boom(args: Input) -> str:
    raise RuntimeError("internal detail /srv/secret.conf")


def hog(args: Input) -> str:
    return str(len(bytearray(2 * 2**30)))


def crash(args: Input) -> str:
    os._exit(3)
