"""Queue and task names of the reactq cluster: the one place they are defined (pure: no imports).

tools_sandbox keeps its own copy (it must not import worker); tests/test_names.py checks they agree.
"""

STEPS_QUEUE = "reactq.steps"
SANDBOX_QUEUE = "reactq.sandbox"
WEBHOOKS_QUEUE = "reactq.webhooks"  # consumed by step workers unless --queues says otherwise
QUEUES = (STEPS_QUEUE, SANDBOX_QUEUE)  # the queues whose depth is watched (the work queues)

STEP_TASK = "reactq.step"
SANDBOX_TASK = "reactq.sandbox.execute"
WEBHOOK_TASK = "reactq.webhook.deliver"
