"""The HTTP API (FastAPI): `app.create_app(runtime)`, authentication, guards and the routes."""
