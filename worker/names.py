"""Queue and task names of the reactq cluster: the one place they are defined (pure: no imports).

tools_sandbox keeps its own copy (it must not import worker); tests/test_names.py checks they agree.
"""

STEPS_QUEUE = "reactq.steps"
SANDBOX_QUEUE = "reactq.sandbox"
QUEUES = (STEPS_QUEUE, SANDBOX_QUEUE)

STEP_TASK = "reactq.step"
SANDBOX_TASK = "reactq.sandbox.execute"
