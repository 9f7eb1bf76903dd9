"""api_stub test fixtures (owned by the api_stub work).

- `stub_server`: one real stub (uvicorn in a background thread, free port) per session.
- `stub_base_url`: its OpenAI base URL ``http://127.0.0.1:PORT/v1``, with faults and
  stats reset before the test (use ``stub_control`` to set faults, read stats).
- `make_stub`: a factory ``make_stub(FaultConfig(...)) -> StubServer`` for a private
  server with its own faults; stopped after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from api_stub import FaultConfig, StubServer


class StubControl:
    """Reads and changes a running stub's faults and stats over HTTP (its /stub/* endpoints)."""

    def __init__(self, root_url: str) -> None:
        self.root_url = root_url

    def set_faults(self, **fields: Any) -> dict[str, Any]:
        response = httpx.post(f"{self.root_url}/stub/faults", json=fields)
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.root_url}/stub/stats").raise_for_status().json()

    def reset(self) -> None:
        self.set_faults()
        httpx.post(f"{self.root_url}/stub/stats/reset").raise_for_status()


@pytest.fixture(scope="session")
def stub_server() -> Iterator[StubServer]:
    server = StubServer().start()
    yield server
    server.stop()


@pytest.fixture
def stub_control(stub_server: StubServer) -> Iterator[StubControl]:
    """The session stub's controls, faults and stats reset before the test; its faults reset after it too:
    a module-scoped fixture set up next on this worker (tests/test_metrics.py's batch) uses the stub without
    this fixture, and once waited out its whole timeout on a 503 fault left by an earlier test."""
    control = StubControl(stub_server.url)
    control.reset()
    yield control
    control.set_faults()


@pytest.fixture
def stub_base_url(stub_server: StubServer, stub_control: StubControl) -> str:
    """Base URL of the session stub, with default faults and zeroed stats."""
    return stub_server.base_url


@pytest.fixture
def make_stub() -> Iterator[Callable[..., StubServer]]:
    started: list[StubServer] = []

    def make(faults: FaultConfig | None = None) -> StubServer:
        server = StubServer(faults=faults).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
