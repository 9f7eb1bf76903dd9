"""What one sandbox container and one warm execution cost the whole machine, outside any batch.

    python bench/container_cost.py [--containers 20] [--executions 200] [--rounds 3] [--tier standard]

Drives tools_sandbox's DockerBackend directly in this process (no pool, no worker), on the engine's default
runtime, and reads the machine's busy CPU (/proc/stat) around each phase, so the engine, the shims and
the processes inside the containers count too. Per round:
  create:    --containers x `create_sandbox` one after another: CPU and wall time per container;
  first run: one `print(6*7)` in each of them (the supervisor's first request);
  remove:    `destroy` of each, then 6 s for the engine's removals to finish (idle time counted too);
  warm run:  --executions x `print(6*7)` one after another in one container: CPU per execution, and how
             much of it this process spent (the rest is the engine and the container's processes).
Run it on a quiet machine: any other load lands in the figures. Every output must be 42.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.proc_cpu import machine_busy_s, process_cpu_s  # noqa: E402
from tools_sandbox.backends.docker_backend import DockerBackend, DockerSandbox  # noqa: E402
from tools_sandbox.base.tiers import get_tier, load_tiers  # noqa: E402

CODE = "print(6*7)"


def run_42(backend: DockerBackend, sandbox: DockerSandbox) -> None:
    executed = backend.run(sandbox, CODE, tenant="bench")
    if executed.result.stdout.strip() != "42":
        raise SystemExit(f"an execution did not print 42: {executed.result}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--containers", type=int, default=20)
    ap.add_argument("--executions", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tier", default="standard")
    ap.add_argument("--image", default="reactq-sandbox:latest")
    args = ap.parse_args()

    tier = get_tier(args.tier, load_tiers())
    backend = DockerBackend(args.image)
    backend.start()
    backend.destroy(backend.create_sandbox(tier))  # the engine's first container pays for its caches
    print("| round | create: CPU / wall ms each | first run: CPU ms each | remove: CPU ms each | warm run: CPU ms "
          "each (this process) | warm run: wall ms each |\n|---|---|---|---|---|---|")
    try:
        for n in range(1, args.rounds + 1):
            busy, wall = machine_busy_s(), time.monotonic()
            boxes = [backend.create_sandbox(tier) for _ in range(args.containers)]
            create_cpu, create_wall = machine_busy_s() - busy, time.monotonic() - wall
            busy = machine_busy_s()
            for sandbox in boxes:
                run_42(backend, sandbox)
            first_cpu = machine_busy_s() - busy
            warm_box, rest = boxes[0], boxes[1:]
            busy = machine_busy_s()
            for sandbox in rest:
                backend.destroy(sandbox)
            time.sleep(6)
            remove_cpu = machine_busy_s() - busy
            me = os.getpid()
            busy, own, wall = machine_busy_s(), process_cpu_s(me), time.monotonic()
            for _ in range(args.executions):
                run_42(backend, warm_box)
            warm_cpu, warm_own, warm_wall = machine_busy_s() - busy, process_cpu_s(me) - own, time.monotonic() - wall
            backend.destroy(warm_box)
            per = 1000 / args.containers
            ex = 1000 / args.executions
            print(f"| {n} | {create_cpu * per:.0f} / {create_wall * per:.0f} | {first_cpu * per:.1f} | "
                  f"{remove_cpu * 1000 / len(rest):.0f} | {warm_cpu * ex:.2f} ({warm_own * ex:.2f}) | "
                  f"{warm_wall * ex:.2f} |", flush=True)
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
