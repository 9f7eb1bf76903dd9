"""A user tool module (REACTQ_TOOL_MODULES='["tests.hostile_tools"]') with tools that misbehave: `spin`
holds the GIL (isolation="process"), `hang` never answers (a thread), `crunch` is a process tool that
answers. Their deadline is $REACTQ_TEST_TOOL_TIMEOUT_S (default 30 s)."""

from __future__ import annotations

import os

from tests import tool_bodies as body
from worker.tools import tool

TIMEOUT_S = float(os.environ.get("REACTQ_TEST_TOOL_TIMEOUT_S", "30"))

# bench/tool_isolation.py --gil-thread: spin on a thread, to show what the process pool buys
SPIN_ISOLATION = "thread" if os.environ.get("REACTQ_TEST_SPIN_IN_THREAD") else "process"

tool("spin", body.Input, "Counts very far (CPU-bound).", isolation=SPIN_ISOLATION, timeout_s=TIMEOUT_S)(body.spin)
tool("hang", body.Input, "Asks a service that never answers.", timeout_s=TIMEOUT_S)(body.hang)
tool("crunch", body.Input, "Echoes its input from a process.", isolation="process")(body.echo)
