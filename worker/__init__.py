"""reactq worker: the ReAct engine, its Redis store, Celery tasks, CLI and HTTP API."""
