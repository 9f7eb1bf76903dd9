"""The pure ReAct engine: run/step models, prompt building, output parsing, the step decision, pricing,
webhook delivery records (`deliveries`).

Nothing here touches Redis, Celery or the network; it imports only the standard library, pydantic,
`worker.errors` and itself (tests/test_layering.py checks it)."""
