"""The Redis exporter against a real redis-server with deploy/redis/acl.conf: Debian's prometheus-redis-exporter
(1.45, the version both deployments run) logs in as the `exporter` ACL user and scrapes with no command
refused (NOPERM), and exports every Redis metric the alert rules read. The deployments run it as that user.

Each check runs on every redis-server this machine has (the one on PATH, and Debian's /usr/bin one, 7.0 like
the deployments' Redis 7, when it is a different one)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import redis
import yaml

from tests.fixtures_alerting import PASSWORDS, REDIS_DIR, Exporter, acl_redis, redis_exporter
from tests.fixtures_k8s import kustomize
from tests.fixtures_prometheus import PROMETHEUS_DIR, Samples, total
from tests.test_deploy import SECRETS, compose_config
from tests.waiting import wait_for

K8S_PROMETHEUS = PROMETHEUS_DIR.parent / "k8s" / "base" / "prometheus" / "prometheus.yml"
EXPORTER_PASSWORD = PASSWORDS["REDIS_EXPORTER_PASSWORD"]
# redis-py's CLIENT SETINFO on connect is refused to these users (NOPERM), which Redis's error statistics
# (server-wide) would count: the test's own clients do not send it.
QUIET = {"lib_name": None, "lib_version": None}


def redis_servers() -> list[str]:
    found = {Path(p).resolve(): p for p in (shutil.which("redis-server"), "/usr/bin/redis-server")
             if p and Path(p).exists()}
    return sorted(found.values()) or ["redis-server"]  # none: acl_redis fails with how to install it


def redis_names_in_rules() -> set[str]:
    """Every redis_* name the alert rules and the dashboard's panels read."""
    rules = yaml.safe_load((PROMETHEUS_DIR / "alerts.rules.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((PROMETHEUS_DIR.parent / "grafana" / "dashboards" / "reactq-overview.json").read_text())
    exprs += [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    return {name for expr in exprs for name in re.findall(r"\bredis_[a-z_]+\b", expr)}


def refused(log: str) -> list[str]:
    """The exporter's log lines of a command Redis refused (with -debug, each failed command is logged)."""
    return [line for line in log.splitlines() if "err: NOPERM" in line or "level=error" in line]


def _scrape_twice(exporter: Exporter) -> Samples:
    """The second scrape: Redis's INFO errorstats then include what the first scrape's commands got."""
    exporter.scrape()
    return exporter.scrape()


@pytest.mark.integration
@pytest.mark.parametrize("redis_server", redis_servers())
def test_exporter_scrapes_as_the_exporter_acl_user_with_no_command_refused(tmp_path: Path,
                                                                          redis_server: str) -> None:
    with acl_redis(tmp_path, redis_server) as server:
        api = redis.Redis.from_url(server.url("api"), **QUIET)
        api.set("reactq:exporter-test", "x")  # keys in two databases: the exporter's keyspace metrics
        api.execute_command("SELECT", 1)
        api.set("reactq:exporter-test", "y")
        with redis_exporter(tmp_path, f"redis://127.0.0.1:{server.port}", "exporter", EXPORTER_PASSWORD) as exporter:
            samples = _scrape_twice(exporter)
            log = exporter.log()
        version = redis.Redis.from_url(server.url("exporter"), **QUIET).info("server")["redis_version"]

    assert total(samples, "redis_up") == 1, log[-2000:]
    assert total(samples, "redis_memory_max_bytes") == 2 * 1024 ** 3  # the production limits
    assert total(samples, "redis_memory_used_bytes") > 0
    assert total(samples, "redis_connected_clients") >= 1
    assert total(samples, "redis_config_maxclients") == 10000
    assert total(samples, "redis_db_keys", db="db0") == 1 and total(samples, "redis_db_keys", db="db1") == 1
    assert total(samples, "redis_exporter_last_scrape_error") == 0
    assert total(samples, "redis_instance_info", redis_version=version) == 1
    # Nothing refused: not in the exporter's log, not in Redis's own error and command statistics.
    assert not refused(log), refused(log)
    assert total(samples, "redis_errors_total", err="NOPERM") == 0
    assert total(samples, "redis_commands_rejected_calls_total") == 0
    # Every Redis metric the alert rules read is one this exporter exports.
    exported = {name for name, _ in samples}
    # a cluster node's own (redis_cluster_state ...): tests/test_redis_cluster_deploy.py, on a real cluster
    single = {n for n in redis_names_in_rules() if not n.startswith("redis_cluster_")}
    assert single <= exported, single - exported
    assert {"redis_memory_used_bytes", "redis_memory_max_bytes", "redis_up"} <= redis_names_in_rules()


@pytest.mark.integration
def test_without_slowlog_len_the_exporter_is_refused(tmp_path: Path) -> None:
    """The check above can fail: an ACL without slowlog|len and client|setname gets NOPERM."""
    acl = (REDIS_DIR / "acl.conf").read_text()
    assert " +slowlog|len" in acl and " +client|setname" in acl
    old = acl.replace(" +slowlog|len", "").replace(" +client|setname", "")
    with acl_redis(tmp_path, acl_text=old) as server:
        with redis_exporter(tmp_path, f"redis://127.0.0.1:{server.port}", "exporter", EXPORTER_PASSWORD) as exporter:
            samples = _scrape_twice(exporter)
            log = exporter.log()
    assert total(samples, "redis_up") == 1
    assert total(samples, "redis_errors_total", err="NOPERM") > 0
    assert total(samples, "redis_commands_rejected_calls_total", cmd="slowlog") > 0
    assert refused(log), log[-2000:]


@pytest.mark.integration
def test_exporter_reports_redis_down_and_a_wrong_password(tmp_path: Path) -> None:
    """What ReactqRedisDown reads: redis_up 0 when Redis does not answer or refuses the exporter's login."""
    with acl_redis(tmp_path) as server:
        addr = f"redis://127.0.0.1:{server.port}"
        with redis_exporter(tmp_path, addr, "exporter", "not-the-password") as exporter:
            assert total(exporter.scrape(), "redis_up") == 0
    with redis_exporter(tmp_path, addr, "exporter", EXPORTER_PASSWORD) as exporter:  # that Redis has stopped
        samples = wait_for("the exporter to see Redis gone", exporter.scrape, 30, 0.5,
                           until=lambda s: ("redis_up", frozenset()) in s)
        assert total(samples, "redis_up") == 0


def test_deployments_run_the_exporter_as_the_exporter_user_and_prometheus_scrapes_it() -> None:
    rendered = compose_config(SECRETS)
    assert rendered.returncode == 0, rendered.stderr
    services = yaml.safe_load(rendered.stdout)["services"]
    env = services["redis-exporter"]["environment"]
    assert env == {"REDIS_ADDR": "redis://redis:6379", "REDIS_USER": "exporter", "REDIS_PASSWORD": "pw-exporter"}
    assert services["redis-exporter"]["build"]["dockerfile"] == "deploy/stack/redis-exporter.Dockerfile"
    assert "prometheus-redis-exporter" in (PROMETHEUS_DIR.parent / "stack" / "redis-exporter.Dockerfile").read_text()
    assert "ports" not in services["redis-exporter"]  # reached by Prometheus only

    objects = kustomize("base")
    [deployment] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "redis-exporter"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "redis-exporter"  # the label Redis's NetworkPolicy admits
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    k8s_env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert k8s_env == {"REDIS_ADDR": "redis://redis:6379", "REDIS_USER": "exporter",
                       "REDIS_PASSWORD": {"secretKeyRef": {"name": "reactq-redis", "key": "exporter"}}}
    assert container["image"].endswith(":v1.45.0")
    [service] = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "redis-exporter"]
    assert service["spec"]["ports"][0]["port"] == 9121

    for path, target in ((PROMETHEUS_DIR / "prometheus.yml", "redis-exporter:9121"),
                         (K8S_PROMETHEUS, "redis-exporter.reactq.svc.cluster.local:9121")):
        jobs = {j["job_name"]: j for j in yaml.safe_load(path.read_text())["scrape_configs"]}
        assert jobs["reactq-redis"]["static_configs"] == [{"targets": [target]}], path
