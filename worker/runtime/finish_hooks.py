"""What happens once a run has finished, after its record says so: webhooks for the run and, when it
was the last of its batch, for the batch; the run's working keys are dropped and its events compacted.
Nothing here can fail the run: errors are logged and dropped."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..core.models import Run, Step
from ..core.views import run_json
from ..store.batch_view import batch_view
from ..store.run_keys import working_keys
from .context import Runtime
from .webhooks import Event, queue_delivery

log = logging.getLogger("reactq.finish")

SendWebhook = Callable[[str, int, float], None]  # (delivery id, attempt, delay s): the Dispatcher's webhook


def queue_webhooks(rt: Runtime, run: Run, send: SendWebhook, batch_progress: tuple[int, int] | None = None) -> None:
    store = rt.webhooks
    url = run.spec.webhook_url or (None if run.spec.batch_id else store.default_url(run.spec.tenant))
    if url:
        queue_delivery(store, run.spec.tenant, Event.RUN_FINISHED, run.id, url, run_json(run), send)
    if run.spec.batch_id is not None:
        queue_batch_webhook(rt, run.spec.batch_id, run.spec.tenant, send, batch_progress)


def queue_batch_webhook(rt: Runtime, batch_id: str, tenant: str | None, send: SendWebhook,
                        progress: tuple[int, int] | None = None) -> bool:
    """The batch's webhook, once: when its submission is complete and every run has finished. Each of
    the last runs of a big batch may ask at nearly the same moment: each reads the batch's progress
    (unless its last write returned it: `progress`) and its hash with whether the one-time marker is
    taken (then it stops there), one of them wins the marker, and only that one builds the
    (constant-size) view. Returns whether this call queued it."""
    finished, size = progress or rt.store.batches.progress(batch_id)
    if finished < size:
        return False
    info = rt.store.batches.info_unless_claimed(batch_id)
    if not info or info.get("submitting"):
        return False  # more runs are coming; the submitter checks again when it is done
    if not rt.store.batches.claim_webhook(batch_id, rt.settings.retention_s):
        return False  # another finishing run got there first
    store = rt.webhooks
    owner = info.get("tenant") or tenant or "default"
    url = info.get("webhook_url") or store.default_url(owner)
    if not url:
        return False
    view = batch_view(rt.store, batch_id)
    if view is None:
        return False
    queue_delivery(store, owner, Event.BATCH_FINISHED, batch_id, url, view, send)
    return True


def batch_may_be_finished(rt: Runtime, batch_id: str, send: SendWebhook, tenant: str | None = None) -> None:
    """Called by a batch's submitter once it is done: every run may have ended while the batch was still
    being submitted, and then its webhook is sent from here. Never fails the submission."""
    try:
        queue_batch_webhook(rt, batch_id, tenant, send)
    except Exception:  # a webhook never affects the batch
        log.exception("could not queue a batch's webhook", extra={"batch_id": batch_id})


def trim_finished(rt: Runtime, run: Run, steps: list[Step] | None = None) -> None:
    """What a finished run keeps is its record, steps and events: the per-step working keys go, and the
    events stop repeating each step's text (one round trip when the caller has the run's steps)."""
    rt.store.drop_and_compact(run.id, working_keys(rt.store, run, steps))


def after_finish(rt: Runtime, run: Run, send: SendWebhook, steps: list[Step] | None = None, *, trimmed: bool = False,
                 batch_progress: tuple[int, int] | None = None) -> None:
    try:
        queue_webhooks(rt, run, send, batch_progress)
    except Exception:  # a webhook never affects the run
        log.exception("could not queue the webhooks of a finished run", extra={"run_id": run.id})
    if trimmed:
        return
    try:
        trim_finished(rt, run, steps)
    except Exception:  # the keys expire anyway
        log.exception("could not trim a finished run's keys", extra={"run_id": run.id})
