"""What happens once a run has finished, after its record says so: webhooks for the run and, when it
was the last of its batch, for the batch. Nothing here can fail the run: errors are logged and dropped."""

from __future__ import annotations

import logging
from collections.abc import Callable

from . import keys
from .core.models import Run
from .display import run_json
from .runtime import Runtime, get_runtime
from .submit import batch_view
from .webhooks import Event, WebhookStore, queue_delivery

log = logging.getLogger("reactq.finish")

Send = Callable[[str, int, float], None]


def webhook_store(rt: Runtime) -> WebhookStore:
    return WebhookStore(rt.redis, rt.settings.retention_s)


def queue_webhooks(rt: Runtime, run: Run, send: Send) -> None:
    store = webhook_store(rt)
    url = run.spec.webhook_url or (None if run.spec.batch_id else store.default_url(run.spec.tenant))
    if url:
        queue_delivery(store, run.spec.tenant, Event.RUN_FINISHED, run.id, url, run_json(run), send)
    batch_id = run.spec.batch_id
    if batch_id is None:
        return
    view = batch_view(rt.store, batch_id)
    if view is None or view["finished"] < view["size"]:
        return
    if not rt.redis.set(keys.batch_webhook_sent(batch_id), "1", nx=True, ex=rt.settings.retention_s):
        return  # another finishing run got there first
    info = rt.store.batch_info(batch_id)
    tenant = info.get("tenant") or run.spec.tenant
    url = info.get("webhook_url") or store.default_url(tenant)
    if url:
        queue_delivery(store, tenant, Event.BATCH_FINISHED, batch_id, url, view, send)


def after_finish(run: Run) -> None:
    try:
        from .webhook_tasks import send_delivery

        queue_webhooks(get_runtime(), run, send_delivery)
    except Exception:  # a webhook never affects the run
        log.exception("could not queue the webhooks of a finished run", extra={"run_id": run.id})
