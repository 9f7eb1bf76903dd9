"""Sandbox test fixtures (owned by the sandbox work)."""
