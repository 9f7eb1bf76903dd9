"""The HTTP side: a FastAPI app speaking OpenAI's chat completions protocol, and ways to run it.

Built for load tests (hundreds of concurrent connections each held seconds by
injected latency): handlers are async, latency is `await asyncio.sleep`, the
brain is pure and cheap, nothing blocks the event loop. State (fault config,
request counter, stats, a private Prometheus registry) lives on the app, so
several servers can share one process in tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import socket
import threading
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from api_stub.brain import respond
from api_stub.faults import FaultConfig, decide, hallucinate, malform, merge_faults
from api_stub.limits import Refusal, ServerLimits
from api_stub.tokens import count_prompt_tokens
from api_stub.wire import apply_limits, completion_body, completion_tokens, error_body, stream_events

__all__ = ["MODEL_ID", "StubServer", "create_app", "serve"]

MODEL_ID = "reactq-stub"
ARRIVALS_KEPT = 100_000
_ERRORS = {
    429: ("Rate limit reached for requests (injected by api_stub).", "rate_limit_error",
          "rate_limit_exceeded"),
    500: ("The server had an error while processing your request (injected by api_stub).", "server_error",
          "internal_error"),
    503: ("The engine is currently overloaded, please try again later (injected by api_stub).",
          "server_error", "service_unavailable"),
}


class DroppedConnection(Exception):
    """Raised inside a response on purpose so uvicorn closes the socket mid-reply (the timeout fault)."""


class _QuietDrops(logging.Filter):
    """Keep uvicorn from logging a traceback for every deliberately dropped connection."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        return not isinstance(exc, DroppedConnection)


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("reactq_stub_requests_total", "Chat completion requests by outcome",
                                ["outcome"], registry=self.registry)
        self.duration = Histogram("reactq_stub_request_duration_seconds", "Chat completion latency",
                                  buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 2.5, 5, 10, 30, 60),
                                  registry=self.registry)
        self.tokens = Counter("reactq_stub_tokens_total", "Tokens billed", ["type"], registry=self.registry)
        self.in_flight = Gauge("reactq_stub_requests_in_flight", "Requests being served",
                               registry=self.registry)


def _server_limits(faults: FaultConfig) -> ServerLimits:
    return ServerLimits(faults.rpm_limit, faults.tpm_limit, faults.limit_burst_s, faults.limit_window_s)


class _State:
    def __init__(self, faults: FaultConfig) -> None:
        self.faults = faults
        self.limits = _server_limits(faults)
        self.counter = 0
        self.completions = 0
        self.in_flight = 0
        self.peak_in_flight = 0  # most completion requests being served at once (since the last reset)
        self.by_status: Tally[str] = Tally()
        self.tools_offered: Tally[str] = Tally()  # tool name -> requests that offered it
        # wall times at which the server-side limits admitted / refused a request (the latest ARRIVALS_KEPT)
        self.admitted: deque[float] = deque(maxlen=ARRIVALS_KEPT)
        self.refused: deque[float] = deque(maxlen=ARRIVALS_KEPT)
        self.metrics = _Metrics()

    def stats(self) -> dict[str, Any]:
        return {"requests": self.counter, "completions": self.completions, "by_status": dict(self.by_status),
                "peak_in_flight": self.peak_in_flight}


def _error(status: int, message: str, type_: str, code: str | None = None, param: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, param), status_code=status, headers=headers)


def _fault_response(status: int, faults: FaultConfig) -> JSONResponse:
    message, type_, code = _ERRORS.get(status, (f"Injected error {status}.", "server_error" if status >= 500
                                                 else "invalid_request_error", f"injected_{status}"))
    headers = None
    if status == 429:
        headers = {"Retry-After": f"{faults.retry_after_s:g}",
                   "retry-after-ms": str(int(math.ceil(faults.retry_after_s * 1000)))}
    return _error(status, message, type_, code, headers=headers)


def _limited(refusal: Refusal) -> JSONResponse:
    what = "requests" if refusal.budget == "rpm" else "tokens"
    headers = {"Retry-After": str(max(1, math.ceil(refusal.retry_after_s))),
               "retry-after-ms": str(max(1, math.ceil(refusal.retry_after_s * 1000)))}
    return _error(429, f"Rate limit reached for {what} per minute (api_stub server-side limit).",
                  "rate_limit_error", "rate_limit_exceeded", headers=headers)


def _bad_request(message: str, param: str | None = None) -> JSONResponse:
    return _error(400, message, "invalid_request_error", "invalid_request", param)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def _dropped(seconds: float):  # noqa: ANN202 - an async generator for StreamingResponse
    await asyncio.sleep(seconds)
    raise DroppedConnection("timeout fault: connection dropped without a reply")
    yield b""  # pragma: no cover - makes this an async generator


def create_app(faults: FaultConfig | None = None) -> FastAPI:
    """The stub application with its own fault config, counters and metrics registry."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietDrops) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(_QuietDrops())
    app = FastAPI(title="reactq api_stub", docs_url=None, redoc_url=None, openapi_url=None)
    state = _State(faults or FaultConfig())
    app.state.stub = state

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "unknown_url" if exc.status_code == 404 else None
        return _error(exc.status_code, str(exc.detail), "invalid_request_error", code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _bad_request(str(exc.errors()[:1]))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 0,
                                            "owned_by": "reactq"}]}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "reactq"}

    @app.get("/stub/faults")
    async def get_faults() -> dict[str, Any]:
        return state.faults.model_dump()

    @app.post("/stub/faults", response_model=None)
    async def set_faults(request: Request) -> dict[str, Any] | JSONResponse:
        try:
            state.faults = FaultConfig.model_validate(await request.json())
        except ValueError as exc:
            return _bad_request(f"invalid fault config: {exc}")
        state.limits = _server_limits(state.faults)
        return state.faults.model_dump()

    @app.get("/stub/stats")
    async def get_stats() -> dict[str, Any]:
        return state.stats()

    @app.get("/stub/stats/tools-offered")
    async def tools_offered() -> dict[str, int]:
        """Tool name -> requests that offered it (reset with the stats)."""
        return dict(state.tools_offered)

    @app.get("/stub/stats/arrivals")
    async def arrivals() -> dict[str, list[float]]:
        """Wall times (s) at which the server-side limits admitted and refused requests (reset with the
        stats): what a provider's windows saw."""
        return {"admitted": list(state.admitted), "refused": list(state.refused)}

    @app.post("/stub/stats/reset")
    async def reset_stats() -> dict[str, Any]:
        state.counter, state.completions, state.peak_in_flight = 0, 0, state.in_flight
        state.by_status.clear()
        state.tools_offered.clear()
        state.admitted.clear()
        state.refused.clear()
        return state.stats()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        started = time.perf_counter()
        state.metrics.in_flight.inc()
        state.in_flight += 1
        state.peak_in_flight = max(state.peak_in_flight, state.in_flight)

        def served() -> None:
            state.in_flight -= 1
            state.metrics.in_flight.dec()

        try:
            response, outcome = await _complete(state, request)
        except BaseException:
            served()
            raise
        if isinstance(response, StreamingResponse):  # in flight until its last chunk is sent
            response.body_iterator = _then(response.body_iterator, served)
        else:
            served()
        state.by_status[str(response.status_code)] += 1
        state.metrics.requests.labels(outcome).inc()
        state.metrics.duration.observe(time.perf_counter() - started)
        return response

    return app


async def _complete(state: _State, request: Request) -> tuple[Response, str]:
    """Serve one chat completion; returns the response and the outcome label for metrics."""
    counter = state.counter
    state.counter += 1
    try:
        body = json.loads(await request.body())
    except ValueError:
        return _bad_request("We could not parse the JSON body of your request."), "bad_request"
    if not isinstance(body, dict):
        return _bad_request("The request body must be a JSON object."), "bad_request"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _bad_request("'messages' must be a non-empty array.", "messages"), "bad_request"
    try:
        faults = merge_faults(state.faults, request.headers.get("x-stub-faults"))
    except ValueError as exc:
        return _bad_request(f"invalid X-Stub-Faults header: {exc}"), "bad_request"

    tools = body.get("tools") or None
    prompt = count_prompt_tokens(messages, tools)
    now = time.time()
    if (refusal := state.limits.admit(now, prompt)) is not None:
        state.refused.append(now)
        return _limited(refusal), "rate_limited"
    state.admitted.append(now)
    decision = decide(faults, counter)
    if decision.latency_s > 0:
        await asyncio.sleep(decision.latency_s)
    if decision.timeout:
        return StreamingResponse(_dropped(faults.timeout_s), media_type="application/json"), "timeout"
    if decision.status is not None:
        return _fault_response(decision.status, faults), f"error_{decision.status}"
    if body.get("model") in faults.fail_models:
        return _fault_response(503, faults), "error_503"

    for offered in tools or []:
        function = offered.get("function") if isinstance(offered, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            state.tools_offered[function["name"]] += 1
    # tool_choice "none" (the engine's best-effort call at a limit): an answer from what was gathered
    reply = respond(messages, tools, final_only=body.get("tool_choice") == "none")
    outcome = "ok"
    if decision.malformed:
        reply, outcome = malform(reply, decision.variant), "malformed"
    elif decision.hallucinate and reply.mode == "text":
        reply, outcome = hallucinate(reply), "hallucinated"
    max_tokens = _int_or_none(body.get("max_completion_tokens")) or _int_or_none(body.get("max_tokens"))
    reply = apply_limits(reply, body.get("stop"), max_tokens)

    completion = completion_tokens(reply)
    state.limits.charge_completion(time.time(), completion)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    state.metrics.tokens.labels("prompt").inc(prompt)
    state.metrics.tokens.labels("completion").inc(completion)
    state.completions += 1
    requested = body.get("model")
    model: str = requested if isinstance(requested, str) and requested else MODEL_ID
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True, default=str).encode()).hexdigest()[:16]
    id_, created = f"chatcmpl-{digest}{counter:08x}", int(time.time())
    if body.get("stream"):
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        events = stream_events(reply, id_=id_, created=created, model=model, usage=usage,
                               include_usage=include_usage)
        if faults.chunk_delay_ms <= 0:  # the whole answer at once: one body, as a server with a cache hit sends it
            return Response("".join(events), media_type="text/event-stream",
                            headers={"Cache-Control": "no-cache"}), outcome
        return StreamingResponse(_paced(events, faults.chunk_delay_ms / 1000), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"}), outcome
    if faults.chunk_delay_ms > 0:  # as a server that does not stream: silent until the whole answer is written
        chunks = sum(1 for _ in stream_events(reply, id_=id_, created=created, model=model, usage=usage,
                                              include_usage=False))
        await asyncio.sleep((chunks - 1) * faults.chunk_delay_ms / 1000)
    return JSONResponse(completion_body(reply, id_=id_, created=created, model=model, usage=usage)), outcome


async def _then(body: AsyncIterable[Any], done: Callable[[], None]) -> AsyncIterator[Any]:
    try:
        async for part in body:
            yield part
    finally:
        done()


async def _paced(events: Iterator[str], delay_s: float) -> AsyncIterator[str]:
    """The stream's chunks, each after the first `delay_s` later than the one before (a model writing slowly;
    an undelayed stream is sent as one body instead)."""
    for i, event in enumerate(events):
        if i and not event.startswith("data: [DONE]"):
            await asyncio.sleep(delay_s)
        yield event


def _uvicorn_config(app: FastAPI, host: str, port: int) -> uvicorn.Config:
    # keep-alive longer than clients' idle expiry (httpx: 5 s) avoids resets on reused connections; no proxy
    # headers: the stub reads no client address, and their middleware ran on every request
    return uvicorn.Config(app, host=host, port=port, backlog=4096, access_log=False, log_level="warning",
                          timeout_keep_alive=75, timeout_graceful_shutdown=5, lifespan="off", proxy_headers=False)


def serve(host: str = "127.0.0.1", port: int = 8900, faults: FaultConfig | None = None) -> None:
    """Run the stub in the foreground until interrupted (what `reactq stub` calls)."""
    uvicorn.Server(_uvicorn_config(create_app(faults), host, port)).run()


class StubServer:
    """A stub server in a background thread of this process, for tests and the demo.

    The constructor does no I/O; `start()` binds (port 0 picks a free port) and
    returns once the server accepts connections; `stop()` shuts it down.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, faults: FaultConfig | None = None) -> None:
        self.host = host
        self.port = port
        self.app = create_app(faults)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:PORT`` (for /healthz, /metrics, /stub/...)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI `base_url`, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"{self.url}/v1"

    def start(self, timeout: float = 15.0) -> StubServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(4096)
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(_uvicorn_config(self.app, self.host, self.port))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"api-stub-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"api_stub did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout)
        self._server, self._thread = None, None

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


