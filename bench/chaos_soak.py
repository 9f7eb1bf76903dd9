"""The chaos soak at scale: thousands of runs through faults, every one of which must end right.

    python bench/chaos_soak.py [--runs 5000] [--python-share 0.1] [--kill-every-s 15] [--out FILE]

The machinery is tests/chaos.py (tests/test_chaos_soak.py runs a small one in the suite): its own
redis-server (AOF, appendfsync everysec), the api_stub over HTTP answering 1 call in 25 with a 500 and
1 in 40 with a 429, three step workers and a Docker sandbox worker (`python -m worker.cli worker`),
`reactq batch` of arithmetic (calculator) and python (sandbox) questions with known answers, resumed with
the same --out whenever it exits early. A random step worker is SIGKILLed and replaced every
--kill-every-s; Redis is SIGKILLed and restarted when 30% and 60% of the results are written, its AOF
cut back by the writes of the last second first (what appendfsync everysec may lose in a host crash).

Prints the report as JSON (and writes it to --out): lost and wrong runs (both must be 0), each `reactq
batch` invocation, each fault with the LLM calls it put at risk (in flight on the killed worker; for
Redis, in flight plus answered in the second before the kill) and the repeated calls after it, and the
calls answered against the minimum (one per step), the reaper's re-kicks by action and the tasks that
raised (from the workers' logs). Exit status 1 if a run was lost or wrong.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.chaos import SoakConfig, built_sandbox_image, soak  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--python-share", type=float, default=0.1)
    parser.add_argument("--kill-every-s", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=8, help="threads per step worker")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="the stub's latency per call")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--out", default=None, help="also write the report as JSON here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the processes it started are stopped
    config = SoakConfig(runs=args.runs, python_share=args.python_share, kill_every_s=args.kill_every_s,
                        concurrency=args.concurrency, latency_ms=args.latency_ms, seed=args.seed,
                        timeout_s=args.timeout_s)
    workdir = Path(tempfile.mkdtemp(prefix="reactq-chaos-soak-"))
    report = soak(config, workdir, built_sandbox_image())
    text = json.dumps(report.summary(), indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    for fault in report.faults:
        print(f"{fault.kind:6} at {fault.at:7.1f} s: {fault.in_flight + fault.answered_last_s:3} calls at risk "
              f"({fault.in_flight} in flight, {fault.answered_last_s} answered in the last second), "
              f"{fault.repeats} repeated after it ({fault.detail})")
    ok = not report.lost and not report.wrong
    print(f"{'PASS' if ok else 'MISS'} {report.runs} runs ({report.python_runs} python) in {report.seconds} s: "
          f"{len(report.lost)} lost, {len(report.wrong)} wrong, {report.duplicate_lines} duplicate lines; "
          f"{len(report.invocations)} batch invocation(s); {report.calls_answered} calls answered for "
          f"{report.min_calls} steps: {report.repeated_calls} repeated against {report.at_risk} at risk "
          f"({report.unexplained_repeats} after the last fault)")
    print(f"reaper re-kicks by action: {report.reaper_actions}; tasks that raised: {len(report.task_errors)}")
    for error in report.task_errors[:5]:
        print(f"  {error}")
    print(f"logs: {workdir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
