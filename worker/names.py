"""Queue and task names of the reactq cluster: the one place they are defined (pure: it imports only the
names of the exchange with the sandbox, defined in tools_sandbox/base/names.py, which imports nothing, since
tools_sandbox must not import worker).
"""

from tools_sandbox.base.names import SANDBOX_QUEUE, SANDBOX_TASK, STEP_TASK

STEPS_QUEUE = "reactq.steps"
WEBHOOKS_QUEUE = "reactq.webhooks"  # taken by the webhook worker beside a step worker (worker/runtime/webhook_pool.py)
QUEUES = (STEPS_QUEUE, SANDBOX_QUEUE)  # the queues whose depth is watched (the work queues)

WEBHOOK_TASK = "reactq.webhook.deliver"

# kombu's Redis transport keeps one list per priority of a queue (worker/tenancy/fairness.py says who gets which).
PRIORITY_STEPS = list(range(10))
PRIORITY_SEP = "\x06\x16"  # queue name + sep + priority


def queue_lists(queue: str) -> list[str]:
    """The Redis lists holding `queue`'s messages, highest priority first."""
    return [queue] + [f"{queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS[1:]]


__all__ = ["PRIORITY_SEP", "PRIORITY_STEPS", "QUEUES", "SANDBOX_QUEUE", "SANDBOX_TASK", "STEPS_QUEUE", "STEP_TASK",
           "WEBHOOKS_QUEUE", "WEBHOOK_TASK", "queue_lists", "step_reprs"]


def step_reprs(run_id: str, index: int) -> dict[str, str]:
    """A step message's `argsrepr` and `kwargsrepr`, as Celery's saferepr writes them (the reaper finds
    runs in the queues by `argsrepr`), given to `apply_async` so that each send skips saferepr (~25 us)."""
    return {"argsrepr": f"[{run_id!r}, {index}]", "kwargsrepr": "{}"}
