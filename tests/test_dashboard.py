"""The Grafana dashboard fits any Grafana and shows every metric reactq exports (offline checks).

- Its data source is the variable `${datasource}` (import asks for input DS_PROMETHEUS, the provisioned
  compose/k8s Grafana falls back to its one Prometheus), and every query is scoped by `$namespace` and `$job`.
- Bar gauges and stats ask for the current value (instant queries).
- Every metric family the code registers (worker.metrics, tools_sandbox.base.metrics, the stub's registry) is in a
  panel or an alert, directly or through a recording rule that one of them uses.
- Every panel expression and variable selector is valid PromQL for the real `promtool check rules`.
- grafana-foundation-sdk (Grafana's own typed models) decodes the dashboard without dropping anything but
  the import metadata.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import REGISTRY, Metric

from tests.fixtures_cluster import ROOT
from tests.fixtures_prometheus import PROMETHEUS_DIR, promtool_binary

GRAFANA_DIR = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA_DIR / "dashboards" / "reactq-overview.json"
RULE_FILES = [PROMETHEUS_DIR / "recording.rules.yml", PROMETHEUS_DIR / "alerts.rules.yml"]
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCOPE = 'namespace=~"$namespace", job=~"$job"'
# What Grafana substitutes; the scope variables as their widest value.
SUBSTITUTES = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "15s", "$namespace": ".*", "$job": ".*"}
# A metric name where it selects series (not a function, not a label).
METRIC = re.compile(r"\b(reactq[:_][a-z0-9_:]+|redis_[a-z0-9_]+|up)\b(?!\s*\()")
INSTANT_PANELS = {"bargauge", "stat", "gauge"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def walk(items: list[dict[str, Any]]) -> None:
        for panel in items:
            found.append(panel)
            walk(panel.get("panels", []))

    walk(dashboard()["panels"])
    return found


def targets() -> dict[str, dict[str, Any]]:
    return {f"{p['title']} / {t['refId']}": t for p in panels() for t in p.get("targets", [])}


def variables() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard()["templating"]["list"]}


def rules() -> list[dict[str, Any]]:
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


def registered_families() -> list[Metric]:
    """Every reactq metric family the code registers: the default registry and the stub's own."""
    import tools_sandbox.base.metrics  # noqa: F401 - registers the sandbox metrics
    import worker.metrics  # noqa: F401
    from api_stub.server import _Metrics

    families = [*REGISTRY.collect(), *_Metrics().registry.collect()]
    return [f for f in families if f.name.startswith("reactq_")]


def sample_names(family: Metric) -> set[str]:
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("", "_sum", "_count")}.get(family.type, ("",))
    return {family.name + suffix for suffix in suffixes}


def test_every_panel_and_query_uses_the_datasource_variable() -> None:
    assert "reactq-prometheus" not in DASHBOARD.read_text()  # no hard-coded uid anywhere
    for panel in panels():
        if panel["type"] != "row":
            assert panel["datasource"] == DATASOURCE, panel["title"]
            assert all(t["datasource"] == DATASOURCE for t in panel["targets"]), panel["title"]
    for variable in variables().values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]


def test_datasource_variable_import_input_and_the_provisioned_default() -> None:
    board = dashboard()
    [ds_input] = board["__inputs"]
    assert ds_input | {"label": None, "description": None} == {
        "name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus",
        "label": None, "description": None}
    source = variables()["datasource"]
    assert (source["type"], source["query"], source.get("multi"), source.get("includeAll")) == (
        "datasource", "prometheus", False, False)
    # Import replaces ${DS_PROMETHEUS} with the chosen data source; provisioning substitutes nothing, so
    # the value matches no data source and Grafana selects one of type prometheus: the provisioned Grafana has
    # exactly one, with a stable uid and isDefault.
    assert source["current"]["value"] == "${DS_PROMETHEUS}"
    provisioned = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text())
    [prometheus] = [d for d in provisioned["datasources"] if d["type"] == "prometheus"]
    assert prometheus["uid"] == "reactq-prometheus" and prometheus["isDefault"] is True


def test_namespace_and_job_variables_list_what_exports_reactq_metrics() -> None:
    found = variables()
    assert list(found) == ["datasource", "namespace", "job"]  # namespace narrows job, so it comes first
    for name in ("namespace", "job"):
        variable = found[name]
        assert variable["type"] == "query" and variable["multi"] is True and variable["includeAll"] is True
        names = r'"reactq_\.\+(\|redis_up)?"'  # job also lists the Redis exporter's
        assert re.fullmatch(rf'label_values\(\{{__name__=~{names}[^}}]*\}}, {name}\)', variable["query"])
        assert variable["refresh"] == 2  # on time range change: a job seen in the range is listed
    assert 'namespace=~"$namespace"' in found["job"]["query"]
    # No namespace label under docker-compose: All must be `.*`, which matches series without it.
    assert found["namespace"]["allValue"] == ".*"
    # All jobs = the listed ones, so `up` and the panels leave a shared Prometheus's other targets out.
    assert "allValue" not in found["job"]


def test_every_selector_of_every_query_is_scoped_by_namespace_and_job() -> None:
    assert len(targets()) > 40
    for where, target in targets().items():
        expr = target["expr"]
        selectors = list(METRIC.finditer(expr))
        assert selectors, f"{where}: no metric in {expr!r}"
        for match in selectors:
            assert expr[match.end():].startswith("{" + SCOPE), f"{where}: {match.group(1)} is not scoped: {expr}"


def test_bar_gauges_and_stats_query_the_current_value() -> None:
    instant = [p for p in panels() if p["type"] in INSTANT_PANELS]
    assert {p["type"] for p in instant} == {"bargauge", "stat"}
    for panel in instant:
        for target in panel["targets"]:
            assert (target.get("instant"), target.get("range")) == (True, False), panel["title"]
    for panel in panels():
        if panel["type"] == "timeseries":
            assert all(t.get("range") is True and not t.get("instant") for t in panel["targets"]), panel["title"]


def test_every_registered_metric_reaches_a_panel_or_an_alert() -> None:
    panel_names = {m.group(1) for t in targets().values() for m in METRIC.finditer(t["expr"])}
    alert_names = {m.group(1) for r in rules() if "alert" in r for m in METRIC.finditer(r["expr"])}
    shown = panel_names | alert_names
    # A recording rule counts through its recorded series, when a panel or an alert uses that series.
    for rule in rules():
        if "record" in rule and rule["record"] in shown:
            shown |= {m.group(1) for m in METRIC.finditer(rule["expr"])}
    families = registered_families()
    assert {"reactq_llm_throttled", "reactq_sandbox_backend_up", "reactq_stub_requests"} <= {f.name for f in families}
    unseen = sorted(f.name for f in families if not sample_names(f) & shown)
    assert not unseen, f"metric families no panel or alert shows: {unseen}"


def test_every_panel_expression_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses a recording rule's expression with Prometheus's own parser: each panel query and
    each variable's series selector becomes one (Grafana's variables replaced first)."""
    exprs = [t["expr"] for t in targets().values()]
    exprs += [re.fullmatch(r"label_values\((.*), \w+\)", v["query"])[1]  # type: ignore[index]
              for v in variables().values() if v["type"] == "query"]
    checked = []
    for expr in exprs:
        for variable, value in SUBSTITUTES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
        checked.append(expr)
    group = {"name": "dashboard", "rules": [{"record": f"dashboard:panel_{i}:expr", "expr": e}
                                            for i, e in enumerate(checked)]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    done = subprocess.run([promtool_binary(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(checked)} rules found" in done.stdout


def test_grafana_foundation_sdk_decodes_the_dashboard_keeping_every_field() -> None:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()  # the panel and query types, so their options decode into typed models
    source = dashboard()
    encoded = json.loads(json.dumps(Dashboard.from_json(source), cls=JSONEncoder))

    def dropped(a: Any, b: Any, path: str) -> list[str]:
        """The paths of `a` that `b` lacks (fields the SDK's models do not know); every kept value unchanged."""
        if isinstance(a, dict):
            assert isinstance(b, dict), path
            lost: list[str] = []
            for key, value in a.items():
                lost += dropped(value, b[key], f"{path}/{key}") if key in b else [f"{path}/{key}"]
            return lost
        if isinstance(a, list):
            assert isinstance(b, list) and len(a) == len(b), path
            return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in dropped(x, y, f"{path}[{i}]")]
        assert a == b, f"{path}: {a!r} became {b!r}"
        return []

    lost = {re.sub(r"\[\d+\]", "[]", p) for p in dropped(source, encoded, "")}
    # Import metadata and the query editor's display copy of a variable's query are not dashboard model fields.
    assert lost == {"/__inputs", "/__requires", "/templating/list[]/definition"}, lost
    assert all(t["expr"] for p in encoded["panels"] for t in p.get("targets", []))
