"""The KEDA overlay (deploy/k8s/autoscale-keda), as the real kustomize renders it:

- every KEDA object is valid against KEDA's own CRDs (v2.20.2, vendored under tests/schemas/);
- each ScaledObject scales on the SUM of every Redis list its queue's messages wait in (one per priority),
  through `advanced.scalingModifiers.formula`, checked the way KEDA's admission webhook checks it;
- KEDA logs in as the Redis user `keda`, proven on a real redis-server (deploy/redis/start.sh, acl.conf):
  it runs KEDA's own scaler script on every queue list and can do nothing else."""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fixtures_cluster import ROOT
from tests.fixtures_crds import crd_errors, crd_schemas
from tests.fixtures_k8s import kustomize
from tests.fixtures_services import free_port, wait_for_port
from worker.names import SANDBOX_QUEUE, STEPS_QUEUE, queue_lists

KEDA_OBJECTS = [d for d in kustomize("autoscale-keda") if d["apiVersion"].startswith("keda.sh/")]
SCALED = {d["metadata"]["name"]: d for d in KEDA_OBJECTS if d["kind"] == "ScaledObject"}
QUEUE_OF = {"step-worker": STEPS_QUEUE, "sandbox-worker": SANDBOX_QUEUE}
ACL = ROOT / "deploy" / "redis"

# The script KEDA's redis scaler runs (EVAL, one key: the trigger's listName) on every poll: kedacore/keda
# v2.20.2, pkg/scalers/redis_scaler.go, NewRedisScaler. It connects with go-redis v9: HELLO 3 AUTH, then PING.
KEDA_SCRIPT = """
\t\tlocal listName = KEYS[1]
\t\tlocal listType = redis.call('type', listName).ok
\t\tif listType == 'zset' then
\t\t\treturn redis.call('zcard', listName)
\t\telseif listType == 'set' then
\t\t\treturn redis.call('scard', listName)
\t\telseif listType == 'hash' then
\t\t\treturn redis.call('hlen', listName)
\t\telseif listType == 'list' or listType == 'none' then
\t\t\treturn redis.call('llen', listName)
\t\telse
\t\t\treturn redis.error_reply('ERR unsupported key type: ' .. listType)
\t\tend
\t"""


def _id(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


# --- KEDA's CRD schemas --------------------------------------------------------------------------------

def test_the_vendored_crds_name_their_keda_version() -> None:
    files = sorted((ROOT / "tests" / "schemas").glob("keda-*/keda.sh_*.yaml"))
    assert {f.name for f in files} >= {"keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml"}
    for f in files:
        version = f.parent.name.removeprefix("keda-")
        assert re.fullmatch(r"2\.\d+\.\d+", version) and f"kedacore/keda v{version} " in f.read_text()


@pytest.mark.parametrize("doc", KEDA_OBJECTS, ids=_id)
def test_keda_object_is_valid_against_kedas_crd(doc: dict[str, Any]) -> None:
    assert (doc["apiVersion"], doc["kind"]) in crd_schemas()
    assert crd_errors(doc) == []


@pytest.mark.parametrize(("path", "value", "why"), [
    (("spec", "advanced", "scalingModifiers", "metricType"), "Utilization", "is not one of"),
    (("spec", "advanced", "scalingModifier"), {"formula": "p0"}, "Additional properties"),  # a typo
    (("spec", "triggers", 0, "listName"), "reactq.steps", "Additional properties"),  # beside, not in, metadata
    (("spec", "minReplicaCount"), 40, "minReplicaCount must be less than or equal to maxReplicaCount"),  # CEL
    (("spec", "triggers", 0, "metadata", "databaseIndex"), 0, "is not of type 'string'"),
])
def test_the_crd_check_refuses_what_the_api_server_would(path: tuple[Any, ...], value: Any, why: str) -> None:
    broken = copy.deepcopy(SCALED["step-worker"])
    *parents, last = path
    node = broken
    for key in parents:
        node = node[key]
    node[last] = value
    errors = crd_errors(broken)
    assert any(why in e for e in errors), errors


# --- scaling on the sum of the lists ---------------------------------------------------------------------

def _summed_names(formula: str) -> list[str]:
    """The trigger names of a formula that is a plain sum of them (KEDA evaluates it with expr-lang)."""
    terms = [t.strip() for t in formula.split("+")]
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", t) for t in terms), formula
    return terms


@pytest.mark.parametrize("name", sorted(QUEUE_OF))
def test_each_worker_scales_on_the_sum_of_its_queues_lists(name: str) -> None:
    spec = SCALED[name]["spec"]
    triggers = spec["triggers"]
    modifiers = spec["advanced"]["scalingModifiers"]
    # What KEDA's webhook requires of a formula (apis/keda/v1alpha1/scaledobject_webhook.go): a target > 0,
    # a metric type other than Utilization, every trigger the formula names defined with that name.
    assert float(modifiers["target"]) > 0
    assert modifiers["metricType"] == "AverageValue"  # target per pod: pods = ceil(sum / target)
    names = [t.get("name") for t in triggers]
    assert all(names) and len(set(names)) == len(names), names
    assert sorted(_summed_names(modifiers["formula"])) == sorted(names)  # each trigger counted once
    # ... and the triggers are exactly the queue's lists, one each, on the keda user.
    assert sorted(t["metadata"]["listName"] for t in triggers) == sorted(queue_lists(QUEUE_OF[name]))
    assert {(t["type"], t["metadata"]["username"], t["authenticationRef"]["name"]) for t in triggers} == {
        ("redis", "keda", "reactq-redis")}


def test_the_issues_backlog_now_scales_out() -> None:
    """8 priority lists with 399 waiting each: scaling on the largest list gave 1 pod; the sum gives 8."""
    spec = SCALED["step-worker"]["spec"]
    waiting = dict.fromkeys([t["name"] for t in spec["triggers"]][2:], 399.0)  # 8 batch lists
    total = sum(waiting.get(n, 0.0) for n in _summed_names(spec["advanced"]["scalingModifiers"]["formula"]))
    pods = min(spec["maxReplicaCount"], math.ceil(total / float(spec["advanced"]["scalingModifiers"]["target"])))
    assert (total, pods) == (3192.0, 8)


def test_keda_authenticates_as_the_keda_role() -> None:
    [auth] = [d for d in KEDA_OBJECTS if d["kind"] == "TriggerAuthentication"]
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "password", "name": "reactq-redis", "key": "keda"}]
    [redis_pod] = [d["spec"]["template"]["spec"] for d in kustomize("base")
                   if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == "redis"]
    env = {e["name"]: e for c in redis_pod["containers"] for e in c.get("env", [])}
    assert env["REDIS_KEDA_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "reactq-redis", "key": "keda"}


# --- the keda Redis user, on a real redis-server -----------------------------------------------------------

@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """redis-server started by deploy/redis/start.sh with acl.conf: (port, role -> password)."""
    variables = sorted(set(re.findall(r"\$\{(REDIS_[A-Z_]+_PASSWORD)\}", (ACL / "acl.conf").read_text())))
    passwords = {v: f"pw-{v.lower()}" for v in variables}
    port = free_port()
    proc = subprocess.Popen(["sh", str(ACL / "start.sh"), str(ACL / "acl.conf"), "--port", str(port),
                             "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", ""],
                            env={**os.environ, **passwords}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield port, {v.removeprefix("REDIS_").removesuffix("_PASSWORD").lower().replace("_", "-"): pw
                     for v, pw in passwords.items()}
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_keda_user_reads_queue_lengths_and_nothing_else(acl_server: tuple[int, dict[str, str]]) -> None:
    port, passwords = acl_server
    worker = redis.Redis(port=port, username="step-worker", password=passwords["step-worker"])
    lists = queue_lists(STEPS_QUEUE) + queue_lists(SANDBOX_QUEUE)
    for n, name in enumerate(lists):
        if n % 3:  # some lists stay empty (TYPE says 'none'; KEDA's script counts 0)
            worker.rpush(name, *[b"message"] * n)
    worker.set("reactq:run:r1", "a run record")
    worker.hset("reactq:tenant:acme", "plan", "standard")

    # go-redis v9's handshake: HELLO 3 with AUTH, then PING.
    keda = redis.Redis(port=port, username="keda", password=passwords["keda"], protocol=3)
    assert keda.ping()
    for n, name in enumerate(lists):
        assert keda.eval(KEDA_SCRIPT, 1, name) == (n if n % 3 else 0), name
        assert keda.llen(name) == (n if n % 3 else 0)

    refused: list[tuple[str, tuple[Any, ...]]] = [
        ("RPUSH", (STEPS_QUEUE, "x")), ("LPOP", (STEPS_QUEUE,)), ("DEL", (STEPS_QUEUE,)),
        ("LRANGE", (STEPS_QUEUE, 0, -1)), ("LMOVE", (STEPS_QUEUE, "reactq.steps.mine", "LEFT", "LEFT")),
        ("GET", ("reactq:run:r1",)), ("HGETALL", ("reactq:tenant:acme",)), ("LLEN", ("reactq:run:r1",)),
        ("KEYS", ("*",)), ("SCAN", (0,)), ("INFO", ()), ("CONFIG", ("GET", "*")), ("CLIENT", ("LIST",)),
        ("SELECT", (1,)), ("FLUSHALL", ()), ("PUBLISH", ("reactq", "x")), ("SUBSCRIBE", ("reactq",)),
        ("SCRIPT", ("FLUSH",)), ("ACL", ("LIST",)),
        ("EVAL", (KEDA_SCRIPT, 1, "reactq:run:r1")),  # KEDA's script, on a key that is not a queue list
    ]
    for command, args in refused:
        with pytest.raises(redis.exceptions.NoPermissionError):
            keda.execute_command(command, *args)
    # A script runs with the user's rights: no writing, no reading values, no other keys from inside one.
    for script, keys in (("return redis.call('rpush', KEYS[1], 'x')", [STEPS_QUEUE]),
                         ("return redis.call('lrange', KEYS[1], 0, -1)", [STEPS_QUEUE]),
                         ("return redis.call('get', 'reactq:run:r1')", []),
                         ("return redis.call('llen', 'reactq:run:r1')", [])):
        with pytest.raises(redis.exceptions.ResponseError):
            keda.eval(script, len(keys), *keys)
    assert [worker.llen(name) for name in lists] == [n if n % 3 else 0 for n in range(len(lists))]
    assert worker.get("reactq:run:r1") == b"a run record"
