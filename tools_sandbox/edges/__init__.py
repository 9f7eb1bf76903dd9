"""The edges: the sandbox service (which constructs the backends), the backend health a worker follows,
the Celery task and the `reactq sandbox` command line. Celery is imported here only."""
