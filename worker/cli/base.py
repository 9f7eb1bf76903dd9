"""What every `reactq` verb module shares: the consoles and the runtime getter.

Its own module so that every verb module imports it, never `main.py`, which owns the command group and
imports each verb module when its verb is asked for.
"""

from __future__ import annotations

import sys

from rich.console import Console

from .collector import setting_up
from .display import labelled

console = Console(stderr=True)
out = Console()


def error(message: object) -> None:
    """`error: MESSAGE` on stderr, the message printed as it is (it may quote stored or given text)."""
    console.print(labelled("error:", "red", message))


def _runtime(patient: bool = False):  # lazy imports: `reactq --help` and `reactq stub` need no Redis
    """The process runtime, once Redis answers. People get an answer within seconds (`patient=False`);
    daemons (`worker`) wait through a Redis restart."""
    with setting_up():
        from ..config import get_settings
        from ..errors import StoreUnavailable
        from ..runtime.context import get_runtime
        from ..store.connection import ping, ping_quickly

        rt = get_runtime(get_settings)
    try:
        if patient:
            ping(rt.redis, rt.settings.redis_url)
        else:
            ping_quickly(rt.settings.redis_url)
    except StoreUnavailable as exc:
        error(f"{exc}. Start Redis or set REACTQ_REDIS_URL.")
        sys.exit(2)
    return rt


def _publisher():
    """The step publisher of a command on a Redis broker, which needs no Celery (worker/tasks/publish.py);
    None on another broker. The command has made its runtime (`_runtime`) by then: no second ping."""
    with setting_up():
        from ..config import get_settings
        from ..runtime.context import get_runtime
        from ..tasks.publish import Publisher

        return Publisher.of(get_runtime(get_settings))


def _senders():
    """(send_step, sending_together) for this command: the publisher's on a Redis broker, else Celery's."""
    publisher = _publisher()
    if publisher is not None:
        return publisher.send_step, publisher.sending_together
    with setting_up():
        from ..tasks.steps import send_step, sending_together

    return send_step, sending_together


def _send_step():
    return _senders()[0]


def _load(run_id: str):
    run = _runtime().store.load_run(run_id)
    if run is None:
        error(f"no run {run_id!r} (unknown id, or its record expired)")
        sys.exit(2)
    return run
