"""Whether this process's sandbox backend can run code: the gauge, the log line, and who is told.

The sandbox service reports each change (`report`); the Celery side subscribes (`on_change`) to stop or
resume consuming `reactq.sandbox`, and a worker's heartbeat asks `backend_up` before it says it serves
the sandbox queue (the reaper ends runs whose calls no worker could take: worker/runtime/reaper.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..base.metrics import BACKEND_UP

log = logging.getLogger(__name__)

_lock = threading.Lock()
_up: dict[str, bool] = {}
_listeners: list[Callable[[bool], None]] = []


def report(backend: str, up: bool, why: str = "") -> None:
    """Record the backend's state; on a change, log it and tell the listeners."""
    with _lock:
        changed = _up.get(backend) is not up
        _up[backend] = up
        listeners = list(_listeners)
    BACKEND_UP.labels(backend=backend).set(1 if up else 0)
    if not changed:
        return
    if up:
        log.info("sandbox backend %s is up: this worker takes sandbox tasks", backend)
    else:
        log.warning("sandbox backend %s is unavailable (%s): this worker takes no sandbox tasks until it "
                    "starts", backend, why or "unknown cause")
    for listener in listeners:
        try:
            listener(up)
        except Exception:  # noqa: BLE001 - a listener's failure must not stop the others
            log.exception("sandbox backend state listener failed")


def on_change(listener: Callable[[bool], None]) -> None:
    with _lock:
        _listeners.append(listener)


def backend_up() -> bool:
    """Whether a backend of this process can run code now (False before any was started)."""
    with _lock:
        return any(_up.values())


def reset() -> None:
    """Forget every backend's state (a closed service); the listeners stay."""
    with _lock:
        _up.clear()
