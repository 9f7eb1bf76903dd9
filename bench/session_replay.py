#!/usr/bin/env python3
"""What a python session's replay costs, in process: exec of the program a session execution runs
(tools_sandbox/base/session.py) against the plain code, alternating, 200 rounds each, for 0, 10 and 50 earlier
cells (each a small data-prep cell: a 100-row list and a sum).

    python bench/session_replay.py
"""
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools_sandbox.base.session import SessionCell, session_program  # noqa: E402

CELL = "rows = [{'n': i, 'v': i * 1.5} for i in range(100)]\ntotal_{k} = sum(r['v'] for r in rows)"


def run(src: str) -> float:
    started = time.perf_counter()
    exec(compile(src, "<p>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102
    return time.perf_counter() - started


for n in (0, 10, 50):
    prog = session_program([SessionCell(code=CELL.replace("{k}", str(i))) for i in range(n)], "print(6*7)", 5.0)
    plain, sess = [], []
    with contextlib.redirect_stdout(io.StringIO()):
        for _ in range(200):
            plain.append(run("print(6*7)"))
            sess.append(run(prog))
    print(f"cells={n}: plain p50 {statistics.median(plain) * 1e6:.0f} us, "
          f"session p50 {statistics.median(sess) * 1e6:.0f} us")
