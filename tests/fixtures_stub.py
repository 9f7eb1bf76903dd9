"""api_stub test fixtures (owned by the api_stub work)."""
