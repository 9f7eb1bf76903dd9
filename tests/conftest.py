"""Shared pytest setup: each area keeps its fixtures in its own plugin module.

scripts/test.sh runs the suite on several pytest-xdist workers (`--dist loadgroup`). Every fixture
already takes what it binds per process (free ports, its own redis-server, tmp paths, containers
labelled with their owner's pid), so tests may run side by side. A module-scoped fixture, though,
would be set up once on each worker that gets one of its module's tests: such a module is kept on
one worker (an `xdist_group` named after it), and its shared cluster or batch is made once.
"""

import pytest

pytest_plugins = [
    "tests.fixtures_services",
    "tests.fixtures_sandbox",
    "tests.fixtures_stub",
    "tests.fixtures_cluster",
    "tests.fixtures_prometheus",
    "tests.harness",
    "tests.fixtures_receiver",
    "tests.fixtures_api",
]


@pytest.hookimpl(tryfirst=True)  # before xdist turns the group into a node id suffix
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        scopes = {d.scope for fixturedefs in (defs.name2fixturedefs.values() if defs else ()) for d in fixturedefs}
        if "module" in scopes and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else item.nodeid))
