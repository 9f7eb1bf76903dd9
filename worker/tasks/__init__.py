"""Everything Celery: the app, our Redis transport, the step and webhook tasks. Thin adapters from a
message to the runtime."""
