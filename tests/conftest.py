"""Shared pytest setup: each area keeps its fixtures in its own plugin module.

scripts/test.sh runs the suite on several pytest-xdist workers (`--dist loadgroup`). Every fixture
already takes what it binds per process (free ports, its own redis-server and stub, tmp paths, containers
labelled with their owner's pid), so tests may run side by side. Two hooks below shape the schedule:

- A module-scoped fixture would be set up once on each worker that gets one of its module's tests: such a
  module is kept on one worker (an `xdist_group` named after it), and its shared cluster or batch is made once.
- xdist hands tests out in collection order, so a long test collected last would run alone at the end and
  stretch the run: the modules that hold the longest tests are collected first (SLOW_FIRST).
"""

from __future__ import annotations

import pytest

pytest_plugins = [
    "tests.fixtures_services",
    "tests.fixtures_sandbox",
    "tests.fixtures_stub",
    "tests.fixtures_cluster",
    "tests.fixtures_redis_cluster",
    "tests.fixtures_prometheus",
    "tests.harness",
    "tests.fixtures_receiver",
    "tests.fixtures_api",
    "tests.fixtures_browser",
    "tests.fixtures_llama",
]

# Longest single tests first (serial durations on the 2-core machine), then the modules with the most
# integration time. Every other module keeps its place after these.
SLOW_FIRST = [
    "test_real_model", "test_compose_stack", "test_ratelimit", "test_chaos_soak", "test_recovery", "test_prometheus",
    "test_integration", "test_shutdown", "test_approvals", "test_tenancy", "test_redis_restart", "test_replay",
    "test_eval", "test_metrics", "test_demo", "test_retention", "test_deploy", "test_eval_stream", "test_webhooks",
    "test_routing", "test_sandbox_agent_path", "test_api", "test_fairness", "test_sandbox_sweeper",
]


def _module_rank(item: pytest.Item) -> int:
    name = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
    return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)


@pytest.hookimpl(tryfirst=True)  # before xdist turns the group into a node id suffix
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_module_rank)  # stable: a module's tests stay together and in their order
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        scopes = {d.scope for fixturedefs in (defs.name2fixturedefs.values() if defs else ()) for d in fixturedefs}
        if "module" in scopes and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else item.nodeid))
