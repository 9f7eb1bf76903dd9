"""A `reactq` command imports and sets itself up without the cyclic collector, and runs with it back on and the
set-up's objects frozen (worker/cli/collector.py). Each case is its own interpreter: the switch is process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fixtures_services import free_port

ROOT = Path(__file__).resolve().parent.parent

# A `reactq status` against a Redis that is not there: it imports its verb, builds the runtime, then exits 2.
# The probe counts the collections from the entry point on and reads the collector as the verb's body starts.
PROBE = """
import atexit, gc, json, sys
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
import worker.cli.base as base
real_runtime, seen = base._runtime, {}

def probed_runtime(*args, **kwargs):
    seen["on_in_the_body"] = gc.isenabled()
    seen["collections_before_the_body"] = len(collections)
    try:
        return real_runtime(*args, **kwargs)
    finally:
        seen["on_after_the_runtime"] = gc.isenabled()
        seen["frozen"] = gc.get_freeze_count()

base._runtime = probed_runtime
atexit.register(lambda: print(json.dumps(seen)))
collections.clear()
sys.argv = ["reactq", "status", "no-such-run"]
from worker.cli import main
main()
"""


def test_a_command_imports_its_verb_and_runtime_without_collections_then_runs_with_the_collector_on() -> None:
    env = {**os.environ, "REACTQ_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr  # Redis is not there
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["collections_before_the_body"] == 0  # the verb's module (models, store, ...) came in unwalked
    assert seen["on_in_the_body"] is True
    assert seen["on_after_the_runtime"] is True
    assert seen["frozen"] > 10_000  # the verb's and the runtime's objects, not a handful


NESTED = """
import gc, json, sys
from worker.cli import collector
if sys.argv[1] == "entry":
    collector.start()
    collector.settle()  # as the verb is resolved
states = []
with collector.setting_up():
    states.append(gc.isenabled())
    with collector.setting_up():
        states.append(gc.isenabled())
    states.append(gc.isenabled())  # the inner stretch does not turn it back on under the outer one
states.append(gc.isenabled())
print(json.dumps({"states": states, "frozen": gc.get_freeze_count()}))
"""


def nested(how: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", NESTED, how], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_nested_set_up_stretches_settle_once_at_the_outermost() -> None:
    seen = nested("entry")
    assert seen["states"] == [False, False, False, True]
    assert seen["frozen"] > 0


def test_a_process_not_started_at_the_entry_point_keeps_its_collector_as_it_is() -> None:
    seen = nested("in-process")  # as the tests call the commands
    assert seen["states"] == [True, True, True, True]
    assert seen["frozen"] == 0
