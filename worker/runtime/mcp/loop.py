"""One asyncio event loop on a daemon thread, per worker process: it owns every MCP session (the SDK's
sessions live on one loop), and the step threads submit coroutines to it with a deadline."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str = "reactq-mcp") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """`coro`'s result, run on the loop; past `timeout_s` it is cancelled and TimeoutError raised
        (the calling thread is free at the deadline whatever the coroutine waits on)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout_s:g} s") from None

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
