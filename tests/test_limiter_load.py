"""The provider limiter with no `window_s`, on a loaded machine (docs/decisions/rate-limits.md).

A user seldom knows the window a provider enforces its per-minute limit in, and production machines are
busy. So: reactq told 85% of the provider's limit, with no window configured, many callers at once, and
CPU burners keeping the machine at twice its cores' load, against the real stub enforcing that limit in
fixed windows of 1, 2, 5 or 10 s. The provider must refuse nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
import redis

from api_stub import FaultConfig, StubServer
from tests.fixtures_cluster import ROOT

PROVIDER_RPM = 600  # 10, 20, 50 or 100 per fixed window of 1, 2, 5 or 10 s
LIMIT_RPM = 510  # what reactq is told: 85% of it
CALLS = 150
WORKERS, THREADS = 3, 8


@pytest.fixture(scope="module")
def loaded_machine() -> Iterator[int]:
    """CPU burners, two per core: a load of at least twice the cores while the module's tests run."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        yield len(burners)
    finally:
        for proc in burners:
            proc.kill()
        for proc in burners:
            proc.wait(10)


@pytest.mark.integration
@pytest.mark.parametrize("provider_window_s", [1, 2, 5, 10])
def test_no_window_configured_85_percent_of_the_limit_is_never_refused_under_load(
    provider_window_s: int, loaded_machine: int, make_stub, redis_url: str  # noqa: ANN001
) -> None:
    stub: StubServer = make_stub(FaultConfig(rpm_limit=PROVIDER_RPM, limit_window_s=provider_window_s))
    redis.Redis.from_url(redis_url).flushdb()
    # three worker processes of eight threads, sharing the limiter through Redis (each imports openai and makes
    # its first connection under load, as a starting worker does)
    workers = [subprocess.Popen([sys.executable, "-m", "tests.limiter_callers", stub.base_url, redis_url,
                                 str(LIMIT_RPM), str(CALLS // WORKERS), str(THREADS)],
                                stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(WORKERS)]
    problems = [line for w in workers for line in w.communicate(timeout=300)[0].split()]
    assert load_is_high(loaded_machine)
    seen = httpx.get(f"{stub.url}/stub/stats/arrivals").json()
    assert len(seen["admitted"]) >= CALLS
    assert seen["refused"] == [] and problems == [], (len(seen["refused"]), problems)


def load_is_high(burners: int) -> bool:
    """The burners are running, and the machine's 1-minute load is at least one per burner's core share."""
    return burners >= 2 * (os.cpu_count() or 1) and os.getloadavg()[0] >= (os.cpu_count() or 1)
