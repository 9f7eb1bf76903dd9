"""The model edge: the openai client and its HTTP pool, the shared provider rate limiter, and model
fallback."""
