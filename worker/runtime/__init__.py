"""The step path a worker runs: the process's collaborators (`context.Runtime`), the step runner,
approvals, finish hooks, webhooks, the sandbox bridge, leases, the reaper and drain. It never imports
celery, fastapi, click or rich: it reaches Celery through the runner's `Dispatcher` seam."""
