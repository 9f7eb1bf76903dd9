"""Shared pytest setup: each area keeps its fixtures in its own plugin module."""

pytest_plugins = [
    "tests.fixtures_services",
    "tests.fixtures_sandbox",
    "tests.fixtures_stub",
    "tests.fixtures_cluster",
    "tests.fixtures_prometheus",
    "tests.harness",
]
