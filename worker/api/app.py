"""The HTTP API: `create_app(runtime)` builds the FastAPI application (routers, body limit, error handlers).

Every route but /healthz, /livez and /metrics acts for the tenant of the caller's API key (`caller_tenant`);
another tenant's run or batch answers 404 exactly like an unknown one. A route reaches the runtime
through its app (`app_state.runtime_of`), never a process global: importing this module does no I/O
and reads no setting.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ..config import Settings
from ..errors import AdmissionRefused, InvalidRequest, StepOutOfRange, TierNotAllowed, TooLarge
from ..runtime.context import Runtime
from ..runtime.metrics_server import initialise
from ..service.submit import known_models
from ..store.connection import RedisError
from ..tenancy.plans import known_tiers
from . import routes_batches, routes_monitoring, routes_runs, routes_tenancy
from .app_state import attach
from .guards import BodyLimit
from .hosts import AllowedHosts, HostGuard
from .ui import UiHeaders, error_response, is_ui, ui_router

log = logging.getLogger("reactq.api")


def create_app(runtime: Runtime, *, no_auth_tenant: str | None = None, serve_metrics: bool = True) -> FastAPI:
    """The API application serving `runtime`. `no_auth_tenant` is only for `reactq api --insecure-no-auth`
    (loopback only): every caller then acts as that tenant, and no API key is checked. `serve_metrics=False`:
    no /metrics here (`reactq api` serves it on a port of its own, `api_metrics_port`)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        initialise(runtime)
        yield

    # No /docs or /redoc: FastAPI's pages load their scripts from a CDN onto the UI's origin (ui-access.md)
    app = FastAPI(title="reactq", version="0.1.0", lifespan=lifespan, generate_unique_id_function=_operation_id,
                  docs_url=None, redoc_url=None)
    attach(app, runtime, no_auth_tenant)
    app.add_middleware(BodyLimit, max_bytes=runtime.settings.max_body_bytes)
    routers = [m.router for m in (routes_tenancy, routes_runs, routes_batches, routes_monitoring)]
    if serve_metrics:
        routers.append(routes_monitoring.metrics_router)
    for router in routers:
        app.include_router(router)
    app.include_router(ui_router)  # the operator UI: pages under /ui (worker/api/ui)
    app.add_middleware(UiHeaders)
    app.add_middleware(HostGuard, allowed=AllowedHosts(runtime.settings.api_allowed_hosts))  # outermost: first
    _handle_errors(app, [r for router in routers for r in router.routes if isinstance(r, APIRoute)])
    _document_settings(app, runtime.settings)
    return app


def _methods(routes: list[APIRoute], request: Request) -> list[str]:
    """Every method some route of the request's path answers."""
    methods: set[str] = set()
    for route in routes:
        if route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods or set()
    return sorted(methods)


def _operation_id(route: APIRoute) -> str:
    """OpenAPI operation ids are the route functions' names (the links between operations name them)."""
    return route.name


def _document_settings(app: FastAPI, settings: Settings) -> None:
    """State in the OpenAPI document the request rules that come from settings: the known tiers and
    models, and the longest question (the routes check them; the document says what they accept)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            models = schema["components"]["schemas"]
            run = models["RunRequest"]["properties"]
            _restrict(run["question"], maxLength=settings.max_question_chars)
            for name in ("RunRequest", "ReplayRequest"):
                _restrict(models[name]["properties"]["model"], enum=known_models(settings))
            for name in ("RunRequest", "BatchRequest", "ReplayRequest"):
                _restrict(models[name]["properties"]["tier"], enum=known_tiers(settings))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _restrict(prop: dict[str, Any], **rules: Any) -> None:
    """Add `rules` to a property's string schema (the string branch of an optional one)."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == "string":
            branch.update(rules)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "status": status}})


def _handle_errors(app: FastAPI, routes: list[APIRoute]) -> None:
    """Every error answers `{"error": {"message", "status"}}` with its status code."""

    @app.exception_handler(StarletteHTTPException)  # ours, and the framework's own (unknown route, wrong method)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if is_ui(request):  # the UI's errors are pages (a 303 back to its sign-in)
            return error_response(request, exc.status_code, str(exc.detail), exc.headers)
        response = _error(exc.status_code, str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:  # Starlette names the methods of the first route of the path only
            response.headers["Allow"] = ", ".join(_methods(routes, request))
        return response

    @app.exception_handler(StepOutOfRange)  # the bound depends on the run, not the request: a conflict
    async def _past_steps(_: Request, exc: StepOutOfRange) -> JSONResponse:
        return _error(409, str(exc))

    @app.exception_handler(TierNotAllowed)
    async def _tier_refused(_: Request, exc: TierNotAllowed) -> JSONResponse:
        return _error(403, str(exc))

    @app.exception_handler(AdmissionRefused)
    async def _too_many(_: Request, exc: AdmissionRefused) -> JSONResponse:
        response = _error(429, str(exc))
        response.headers["Retry-After"] = str(exc.retry_after_s)
        return response

    @app.exception_handler(RedisError)
    async def _store_down(request: Request, exc: RedisError) -> Response:
        log.warning("Redis error while serving a request: %s", exc.__class__.__name__)
        if is_ui(request):
            return error_response(request, 503, "the run store is unavailable; try again shortly", None)
        return _error(503, "the run store is unavailable; try again shortly")

    @app.exception_handler(TooLarge)
    async def _too_large(_: Request, exc: TooLarge) -> JSONResponse:
        return _error(422, str(exc))

    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, exc: InvalidRequest) -> JSONResponse:
        return _error(422, str(exc))

    @app.exception_handler(ValidationError)
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: ValidationError | RequestValidationError) -> Response:
        message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        if is_ui(request):
            return error_response(request, 422, message, None)
        return _error(422, message)
