"""Celery tasks: thin adapters from a message to the step runner."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from celery import Celery, signals

from .. import logs
from ..config import get_settings
from ..core.outcome import Outcome
from ..errors import LLMThrottled
from ..names import SANDBOX_QUEUE, SANDBOX_TASK, STEP_TASK, STEPS_QUEUE, step_reprs
from ..runtime.context import get_runtime
from ..runtime.drain import IN_FLIGHT, start_drain
from ..store.cas import Command
from .app import app
from .broker import TRANSPORT
from .publish import Publisher, step_message
from .webhooks import send_delivery

# The step runner (the LLM stack, tools, templates, schemas) is imported where a step runs: a worker loads it
# as it starts (worker/tasks/worker_setup.py); whoever only sends steps (`reactq batch`, the API) never does.
if TYPE_CHECKING:
    from ..runtime.runner import Dispatcher

log = logging.getLogger("reactq.tasks")


def running_priority() -> int | None:
    """The priority of the step task running on this thread (None outside one): its run's."""
    return (step.request.delivery_info or {}).get("priority")


def send_step(run_id: str, index: int, priority: int | None = None, countdown: float | None = None,
              producer: Any = None, retry: bool = True) -> None:
    """Enqueue a step; without a priority it keeps the priority of the step running on this thread.

    `declare=[]`: Celery would declare the queue on every publish (binding copies of the queue and its
    exchange to the channel, ~30 us of CPU a message). A message to the default exchange goes straight
    to the queue's Redis list; the workers declare the queue as they start consuming. `retry=False`
    for a producer's batch, which sends nothing as a message is published (nothing to retry)."""
    if priority is None:
        priority = running_priority()
    step.apply_async(args=[run_id, index], queue=STEPS_QUEUE, priority=priority, countdown=countdown,
                     producer=producer, declare=[], retry=retry, **step_reprs(run_id, index))


@contextmanager
def sending_together(celery: Celery | None = None) -> Iterator[Callable[..., None]]:
    """A send_step whose messages wait in one pipeline and go out together as the block ends (kombu's
    Producer.batch): a submission's first steps in one round trip instead of one each, ~110 instead of
    ~200 us of CPU a message (BENCHMARKS.md). Leaving the block with an exception drops the messages not
    sent yet; their runs are recorded, and the reaper re-kicks them (`lost_message`)."""
    with (celery or app).producer_or_acquire() as producer, producer.batch():
        yield functools.partial(send_step, producer=producer, retry=False)


def step_commands(run_id: str, index: int, priority: int | None = None) -> list[Command]:
    """The Redis command that enqueues step `index` as send_step would (its priority included: by default the
    running step's), for the step's commit to write: the next step goes out in the same transaction that
    records this one and lets go of the run's lease, one round trip fewer than sending it after. The message
    is written without Celery (worker/tasks/publish.py)."""
    if priority is None:
        priority = running_priority()
    return [("LPUSH", *step_message(run_id, index, priority))]


def send_sandbox(request: dict[str, Any]) -> None:
    """Send a sandboxed call; its result comes back as the step's continuation with this run's priority: the
    continuation runs the next step's model call (run_step's go_on), so it waits its turn like that step
    would (docs/decisions/fair-queues.md). A call whose turn in its tenant's line has not come is parked there
    instead: a sandbox worker sends it when its turn comes (worker/runtime/sandbox_bridge.py, SandboxLine)."""
    body = {**request, "continue_priority": running_priority()}
    if not get_runtime(get_settings).sandbox_line.parked(body):
        publisher = worker_publisher()
        if publisher is not None:
            publisher.send_task(SANDBOX_TASK, [body], SANDBOX_QUEUE)
        else:
            app.send_task(SANDBOX_TASK, args=[body], queue=SANDBOX_QUEUE)


def send_next_step(run_id: str, index: int) -> None:
    """A step sent after its commit (the broker apart) or re-kicked by the reaper, on the running step's priority:
    written without Celery where the broker is a Redis."""
    publisher = worker_publisher()
    if publisher is not None:
        publisher.send_step(run_id, index, running_priority())
    else:
        send_step(run_id, index)


@functools.cache
def worker_publisher() -> Publisher | None:
    """How this process sends a message with no countdown when its broker is a Redis (worker/tasks/publish.py;
    Celery's send_task, ~0.3 ms of CPU a message, was a fifth of a sandbox worker's time); None on another."""
    return Publisher.of(get_runtime(get_settings))


@functools.cache
def celery_dispatch() -> Dispatcher:
    """How the step runner enqueues work in this process. With kombu's own transport (a broker URL that is
    not redis:// or rediss://), or a broker on another server than the runs (REACTQ_BROKER_URL), the next
    step is sent after the commit instead, the reaper behind it (docs/decisions/broker-apart.md)."""
    from ..runtime.runner import Dispatcher

    return Dispatcher(next_step=send_next_step, sandbox=send_sandbox, webhook=send_delivery,
                      step_commands=step_commands if app.conf.broker_transport == TRANSPORT
                      and not get_settings().broker_apart else None)


BUSY_RETRIES = 20
BUSY_RETRY_S = 0.5


@app.task(name=STEP_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def step(self: Any, run_id: str, index: int) -> str:
    """Make progress on step `index` of run `run_id` (idempotent; fenced on the step number).

    When another delivery holds the run's lease (a duplicate, or a sandbox continuation that arrived
    before the dispatching step let go), try again shortly; past that the reaper has the run.
    When the shared provider limit has no capacity soon enough, the step goes back to the queue with
    a countdown and this worker thread serves other runs meanwhile (worker/llm/ratelimit.py); so does a step
    whose model call failed for now (worker/core/provider_trouble.py)."""
    from ..runtime.runner import StepRunner

    runner = StepRunner(get_runtime(get_settings), celery_dispatch())
    try:
        with IN_FLIGHT.track(run_id, index):
            result = runner.run_step(run_id, index, go_on=True)
            if result.go_on and result.next_step is not None:  # recorded a stored reply's step: the next is ours
                index = result.next_step
                with IN_FLIGHT.track(run_id, index), logs.bound(step=index):
                    result = runner.run_step(run_id, index)
    except LLMThrottled as exc:
        send_step(run_id, index, countdown=exc.wait_s)
        return "throttled"
    if result.retry_in_s is not None:  # the model's provider is in trouble: this thread serves other runs
        send_step(run_id, index, countdown=result.retry_in_s)
    if result.outcome == Outcome.BUSY and self.request.retries < BUSY_RETRIES:
        raise self.retry(args=[run_id, index], countdown=BUSY_RETRY_S, max_retries=BUSY_RETRIES)
    return result.outcome.value


@signals.worker_init.connect
def _make_broker_pools(sender: Any = None, **_: Any) -> None:
    """Create Celery's connection and producer pools now, in one thread, before any task runs. Made lazily,
    by the first tasks of a fresh worker at once (one taking a backlog), they race: one thread sets
    kombu's global limit and resizes the pools while another sizes the producer pool in use from a pool
    not resized yet ("RuntimeError: Can't shrink pool when in use: was=512 now=10", seen in the chaos
    soak; the step failed and the reaper re-kicked its run)."""
    app.pool  # noqa: B018 - the properties create the pools
    app.amqp.producer_pool  # noqa: B018


@signals.worker_shutting_down.connect
def _drain_on_shutdown(sender: Any = None, sig: str = "", how: str = "", **_: Any) -> None:
    """SIGTERM (warm shutdown): Celery takes no new message; bound how long the steps in flight may take."""
    if how == "Warm":
        rt = get_runtime(get_settings)
        start_drain(rt.settings.drain_timeout_s, send_step, rt.leases)
