"""An HTTP client for `reactq api` running on the test cluster (started by `start_api`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest


@pytest.fixture
def api_client(start_api: Callable[..., str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=start_api(), timeout=30) as client:
        yield client
