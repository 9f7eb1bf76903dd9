"""Name lookups for webhook attempts: each on a thread of its own, waited on only until the attempt's
deadline, and at most `per_tenant` of one tenant's pending at once in this process.

A shared lookup pool is a line: lookups abandoned at their deadline (a tenant's name server that never
answers; the system resolver gives up on its own, after seconds) keep its threads, and every other
tenant's lookups wait behind them until their own deadlines pass. Here no lookup waits for another's
thread. A tenant's abandoned lookups still count until they end, so a tenant with a slow name server (or
with many host names under one) holds at most `per_tenant` threads; past that its attempts fail at once
as timeouts, without a lookup, and other tenants are not affected.
"""

from __future__ import annotations

import threading
import typing
from collections.abc import Callable

from ..core.deliveries import AttemptError
from ..errors import WebhookUnreachable

Resolve = Callable[..., list[typing.Any]]  # socket.getaddrinfo's signature


class Lookups:
    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._pending: dict[str, int] = {}
        self._lock = threading.Lock()

    def pending(self, tenant: str) -> int:
        with self._lock:
            return self._pending.get(tenant, 0)

    def bounded(self, resolve: Resolve, tenant: str, seconds: float) -> Resolve:
        """`resolve` for one of `tenant`'s attempts, answering within `seconds`, else a typed timeout."""
        def lookup(host: str, port: int, **options: typing.Any) -> list[typing.Any]:
            with self._lock:
                if self._pending.get(tenant, 0) >= self.per_tenant:
                    raise WebhookUnreachable(AttemptError.TIMEOUT,
                                             f"{host} not looked up: earlier lookups of this tenant's hosts "
                                             "have not ended")
                self._pending[tenant] = self._pending.get(tenant, 0) + 1
            done = threading.Event()
            found: list[list[typing.Any]] = []
            failed: list[Exception] = []

            def run() -> None:
                try:
                    found.append(resolve(host, port, **options))
                except Exception as exc:  # handed to the waiting attempt, if it still waits
                    failed.append(exc)
                finally:
                    self._done(tenant)
                    done.set()

            threading.Thread(target=run, name="reactq-webhook-dns", daemon=True).start()
            if not done.wait(seconds):
                raise WebhookUnreachable(AttemptError.TIMEOUT,
                                         f"{host} did not resolve within the {seconds:g} s deadline")
            if failed:
                raise failed[0]
            return found[0]
        return lookup

    def _done(self, tenant: str) -> None:
        with self._lock:
            left = self._pending.get(tenant, 0) - 1
            if left > 0:
                self._pending[tenant] = left
            else:
                self._pending.pop(tenant, None)
