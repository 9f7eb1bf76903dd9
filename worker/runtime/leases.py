"""Step leases that live exactly as long as the worker holding them.

A lease keeps duplicate deliveries of a step from calling the LLM twice. It has a short TTL that a
background thread renews while the step works, so a slow LLM call keeps its lease but a killed
worker's leases lapse within one TTL and the reaper can hand its runs to another worker.
"""

from __future__ import annotations

import logging
import threading
import uuid

from ..store.leases import Leases

log = logging.getLogger("reactq.leases")


class LeaseKeeper:
    def __init__(self, store: Leases, ttl_s: float) -> None:
        self.store = store
        self.ttl_ms = max(1000, int(ttl_s * 1000))
        self._held: dict[str, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @staticmethod
    def new_token() -> str:
        return uuid.uuid4().hex

    def hold(self, run_id: str, token: str) -> None:
        """Keep renewing a lease taken with `token` until it is released."""
        with self._lock:
            self._held[run_id] = token
            if self._thread is None:
                self._thread = threading.Thread(target=self._renew_forever, name="reactq-leases", daemon=True)
                self._thread.start()

    def release(self, run_id: str, token: str) -> None:
        """Let go of a lease this keeper still holds with `token` (stop renewing it, delete it)."""
        with self._lock:
            held = self._held.get(run_id) == token
            if held:
                del self._held[run_id]
        if held:
            self.store.release(run_id, token)

    def held(self) -> list[str]:
        """The runs whose leases this keeper renews."""
        with self._lock:
            return list(self._held)

    def forget(self, run_id: str, token: str) -> None:
        """Stop renewing a lease that a transaction has already deleted in Redis."""
        with self._lock:
            if self._held.get(run_id) == token:
                del self._held[run_id]

    def surrender(self) -> list[str]:
        """Release every lease this process holds (a drain that ran out of time); returns their run ids."""
        with self._lock:
            held, self._held = self._held, {}
        for run_id, token in held.items():
            self.store.release(run_id, token)
        return list(held)

    def _renew_forever(self) -> None:
        stop = threading.Event()
        while not stop.wait(self.ttl_ms / 3000):
            with self._lock:
                held = list(self._held.items())
            try:
                self.store.renew(held, self.ttl_ms)
            except Exception:  # Redis restarting: the next round retries; a lapsed lease only costs a duplicate
                log.exception("lease renewal failed")
