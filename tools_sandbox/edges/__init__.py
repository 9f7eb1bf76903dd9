"""The edges: the sandbox service (which constructs the backends), the backend health a worker follows, the
sandbox worker (one per process: its Redis client, quota gate, service and line pump, and what a delivery of
a call does), the Celery task and the `reactq sandbox` command line. Celery is imported here only."""
