"""The names of a step's exchange with the sandbox (pure: no imports): the sandbox task and its queue, and the
one task a sandbox call may continue to, the step task. The one place they are spelled: worker/names.py
imports them from here (tools_sandbox never imports worker)."""

SANDBOX_QUEUE = "reactq.sandbox"
SANDBOX_TASK = "reactq.sandbox.execute"
STEP_TASK = "reactq.step"  # registered by worker/tasks/steps.py
