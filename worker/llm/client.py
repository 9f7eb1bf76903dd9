"""The LLM edge: one chat call through the official `openai` client, with retries and backoff.

The step runner sees the model only through the `LLMClient` protocol (`Runtime.llm`), so tests and
benchmarks script it at our own seam (tests/harness.py) instead of patching the openai client.

`openai` is imported on first use, not with this module: importing it builds about a thousand pydantic
models (~0.5 CPU s), which every interactive command (`reactq status`, `ask`, `batch`...) would pay
for nothing, since only workers call the model.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import httpx2
from pydantic import BaseModel, ValidationError
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from ..core.models import LLMReply, ToolCall, Usage
from ..core.parser import join_reasoning, split_reasoning
from ..core.prompts import estimate_tokens
from ..core.provider_trouble import CONTEXT_EXCEEDED
from ..errors import LLMError
from .http_pool import LLMHTTPClient
from .in_flight import InFlightCap, KeepAlive
from .stream import StreamedCompletion

if TYPE_CHECKING:
    import openai


class LLMClient(Protocol):
    """A chat model: the messages of the next turn and the request options in, the normalised reply out.
    Raises LLMError when the call fails for good."""

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> LLMReply: ...


POOL_SHARDS = 16  # clients (and connection pools) per process that worker threads share


def _retryable(exc: BaseException) -> bool:
    import openai

    # APIConnectionError includes APITimeoutError
    retryable = (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)
    return isinstance(exc, retryable) or (isinstance(exc, openai.APIStatusError) and exc.status_code == 408)


def _retry_after(exc: BaseException | None) -> float | None:
    """The server's own wait hint (retry-after-ms, then Retry-After seconds), capped at 60 s."""
    response = getattr(exc, "response", None)
    if response is None:
        return None
    headers = response.headers
    try:
        if "retry-after-ms" in headers:
            return min(60.0, float(headers["retry-after-ms"]) / 1000)
        if "retry-after" in headers:
            return min(60.0, float(headers["retry-after"]))
    except ValueError:
        return None
    return None


def preload() -> None:
    """Pay now what a process's first model call would pay inside it: importing openai (~0.3 s of CPU) and
    httpcore2, the shared TLS context, and httpx2's first client (its URL parser's first use). In a step
    worker every thread waits for that import together, so its first steps stalled for it (BENCHMARKS.md);
    a step worker calls this as it starts."""
    import openai  # noqa: F401

    LLMHTTPClient(httpx2.Limits(max_connections=1), 1.0).close()


class OpenAIChat:
    """Chat completions against any OpenAI-compatible endpoint.

    Threads share clients by shard, each with its own connection pool. A worker runs hundreds of steps
    at once, one per thread, and one shared httpx pool scans all of its connections and waiting requests
    under a lock on every request and every response close: at 300 threads per process that was three
    quarters of a step's CPU (BENCHMARKS.md, case (c)). A client per thread would cost a client's
    construction for every new thread; a few shards keep each pool small and are built once."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        max_connections: int = 512,
        backoff_base_s: float = 0.5,
        backoff_cap_s: float = 20.0,
        on_attempt: Any = None,
        on_rate_limited: Any = None,
        before_retry: Any = None,
        before_send: Any = None,
        stream: bool = True,
        in_flight: InFlightCap | None = None,
    ) -> None:
        self.base_url = base_url
        self._api_key = api_key
        self._timeout_s = timeout_s
        shards = min(POOL_SHARDS, max_connections)
        self._per_shard = -(-max_connections // shards)  # the shards' pools add up to max_connections
        self._shards: list[openai.OpenAI | None] = [None] * shards
        self._shard_of_thread = threading.local()
        self._next_shard = itertools.count()
        self._lock = threading.Lock()
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.on_attempt = on_attempt  # callback(model, outcome, seconds) for metrics
        self.on_rate_limited = on_rate_limited  # callback(model, retry_after_s | None): the shared cool-down
        self.before_retry = before_retry  # callback(model) before retrying a 429: the shared limiter's slot
        self.before_send = before_send  # callback(model) right before each request goes out: the window guard
        self.stream = stream  # stream completions: the timeout is then on silence, not on the whole answer
        self.in_flight = in_flight  # the cap on requests in flight to a model's server, over every worker

    def _client(self) -> openai.OpenAI:
        """This thread's shard's client (threads are dealt to shards in turn, once)."""
        import openai

        shard = getattr(self._shard_of_thread, "index", None)
        if shard is None:
            shard = self._shard_of_thread.index = next(self._next_shard) % len(self._shards)
        client = self._shards[shard]
        if client is None:
            with self._lock:
                client = self._shards[shard]
                if client is None:
                    limits = httpx2.Limits(max_connections=self._per_shard, max_keepalive_connections=self._per_shard)
                    client = openai.OpenAI(
                        base_url=self.base_url, api_key=self._api_key, timeout=self._timeout_s, max_retries=0,
                        http_client=LLMHTTPClient(limits, self._timeout_s),
                    )
                    self._shards[shard] = client
        return client

    def close(self) -> None:
        with self._lock:
            clients, self._shards = self._shards, [None] * len(self._shards)
        for client in clients:
            if client is not None:
                client.close()

    def _delay(self, exc: BaseException | None, failed_attempts: int) -> float:
        """How long to wait after `failed_attempts` attempts, the last failing with `exc`."""
        hinted = _retry_after(exc)
        if hinted is not None:
            return hinted
        return min(self.backoff_cap_s, self.backoff_base_s * 2 ** (failed_attempts - 1))

    def chat(self, messages: list[dict[str, Any]], *, deadline_at: float | None = None, **options: Any) -> LLMReply:
        """`deadline_at` (epoch seconds): the run's deadline, which bounds every attempt (its timeout, and a
        streamed answer still coming) and the waits between them. A timed-out request is repeated once at
        most: a slow model asked again is only slower. A request that lost its connection is tried once more:
        a server that is down is waited for by re-queueing the step (worker/core/provider_trouble.py), not by
        holding this thread through the backoff. The tokens of attempts that failed after the request
        went out (the provider may bill them) are the reply's or the error's `lost_usage`."""
        import openai

        model = options.get("model", "")
        body = {"messages": messages, **options}
        started = time.monotonic()
        attempts, timeouts, disconnects = 1, 0, 0
        lost = _LostTokens(body)
        failures: list[BaseException] = []

        def retryable(exc: BaseException) -> bool:
            if left() <= 0:  # the run's deadline: no time for another try
                return False
            if isinstance(exc, openai.APITimeoutError):
                return timeouts <= 1
            if isinstance(exc, openai.APIConnectionError):
                return disconnects <= 1
            return _retryable(exc)

        def count(exc: BaseException) -> None:
            nonlocal timeouts, disconnects
            failures.append(exc)
            timeouts += isinstance(exc, openai.APITimeoutError)
            disconnects += isinstance(exc, openai.APIConnectionError) and not isinstance(exc, openai.APITimeoutError)

        def left() -> float:
            return float("inf") if deadline_at is None else deadline_at - time.time()

        try:
            try:
                response = self._attempt(model, body, self._timeout_for(left(), attempts), deadline_at, lost)
            except openai.OpenAIError as exc:
                count(exc)
                if not retryable(exc) or self.max_retries == 0:
                    raise
                # Only a failed first attempt pays for the retry machinery.
                time.sleep(max(0.0, min(self._delay(exc, 1), left())))
                retrying = Retrying(
                    retry=retry_if_exception(retryable),
                    stop=stop_after_attempt(self.max_retries),
                    wait=lambda state: max(0.0, min(left(), self._delay(
                        state.outcome.exception() if state.outcome else None, state.attempt_number + 1))),
                    reraise=True,
                )
                rate_limited = isinstance(exc, openai.RateLimitError)
                for attempt in retrying:
                    with attempt:
                        if left() <= 0:  # the wait reached the deadline: the last failure says why
                            raise failures[-1] from None
                        attempts += 1
                        if rate_limited and self.before_retry is not None:
                            self.before_retry(model)  # may raise LLMThrottled: the step is re-queued
                        try:
                            response = self._attempt(model, body, self._timeout_for(left(), attempts),
                                                     deadline_at, lost)
                        except openai.OpenAIError as failed:
                            rate_limited = isinstance(failed, openai.RateLimitError)
                            count(failed)
                            raise
        except openai.OpenAIError as exc:
            raise LLMError(f"LLM call failed after {attempts} attempt(s): {_describe(exc)}", attempts,
                           _outcome(exc), lost_usage=lost.usage) from None
        reply = parse_completion(response, attempts, int((time.monotonic() - started) * 1000))
        reply.lost_usage = lost.usage
        return reply

    def _timeout_for(self, left_s: float, attempt: int) -> float:
        """The attempt's timeout: the configured one, cut to what is left of the run's deadline. Nothing is
        sent once the deadline has passed."""
        if left_s <= 0:
            raise LLMError(f"LLM call not sent: the run's deadline passed ({attempt - 1} attempt(s) made)",
                           attempt - 1, "timeout")
        return min(self._timeout_s, left_s)

    def _attempt(self, model: str, body: dict[str, Any], timeout_s: float, deadline_at: float | None,
                 lost: _LostTokens) -> bytes | dict[str, Any]:
        """One HTTP call; the completion's body. The client's documented low-level post: same auth and errors
        as chat.completions.create, without its typed-params transform and without building its
        ChatCompletion model; we validate the body into our own smaller shape instead (BENCHMARKS.md,
        "A cheaper step")."""
        import openai

        client = self._client()  # the first call of a process imports openai: before the guard, not after
        if self.before_send is not None:
            self.before_send(model)
        t0 = time.monotonic()
        folded = StreamedCompletion() if self.stream else None
        try:
            with self._slot(model) as keep_alive:
                if folded is None:
                    response: bytes | dict[str, Any] = client.post(
                        "/chat/completions", cast_to=httpx2.Response, body=body,
                        options={"timeout": timeout_s}).content
                else:
                    response = _streamed(client, body, timeout_s, deadline_at, folded, keep_alive)
        except LLMError:  # a stream longer than any reply
            self._report(model, "error", time.monotonic() - t0)
            raise
        except openai.OpenAIError as exc:
            lost.attempt_failed(exc, folded.chars if folded is not None else 0)
            self._report(model, _outcome(exc), time.monotonic() - t0)
            if isinstance(exc, openai.RateLimitError) and self.on_rate_limited is not None:
                self.on_rate_limited(model, _retry_after(exc))
            raise
        self._report(model, "ok", time.monotonic() - t0)
        return response

    def _slot(self, model: str) -> contextlib.AbstractContextManager[KeepAlive]:
        return self.in_flight.slot(model) if self.in_flight is not None else contextlib.nullcontext(_no_keep_alive)

    def _report(self, model: str, outcome: str, seconds: float) -> None:
        if self.on_attempt is not None:
            self.on_attempt(model, outcome, seconds)


def _no_keep_alive() -> None:
    return None


def _streamed(client: openai.OpenAI, body: dict[str, Any], timeout_s: float, deadline_at: float | None,
              folded: StreamedCompletion, keep_alive: KeepAlive) -> bytes | dict[str, Any]:
    """The completion, streamed (SSE) and folded back into one body. `timeout_s` is the longest silence
    (before the first chunk and between two); the run's deadline bounds the whole answer. A server that
    answers whole though asked to stream is read whole.

    openai's post sends the request and maps its errors up to the response's headers; the events are read
    here, line by line (`data: {...}`), which costs a third of the CPU of openai's own SSE decoder."""
    import openai

    stream = client.post("/chat/completions", cast_to=object, options={"timeout": timeout_s}, stream=True,
                         body={**body, "stream": True, "stream_options": {"include_usage": True}},
                         stream_cls=openai.Stream[object])
    response = stream.response
    done = False
    with stream:
        try:
            if "text/event-stream" not in response.headers.get("content-type", ""):
                return response.read()
            for line in response.iter_lines():
                if done or not line.startswith("data:"):
                    continue  # blank separators, comments, event names; anything after [DONE]
                data = line[5:].strip()
                if data == "[DONE]":  # read on to the body's end: a connection closed mid-body is not reused
                    done = True
                    continue
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue  # a provider's garbage line: the folded reply is validated as a whole
                if isinstance(chunk, dict) and chunk.get("error"):  # a server error, after the 200: try later
                    raise LLMError("LLM call failed: the provider reported an error mid-answer", 1, "server_error")
                folded.add(chunk)
                keep_alive()
                if deadline_at is not None and time.time() > deadline_at:
                    raise openai.APITimeoutError(request=response.request)
        except httpx2.TimeoutException as exc:  # as openai maps them when it reads a body itself
            if done:  # the answer is whole; only the body's end did not come
                return folded.body()
            raise openai.APITimeoutError(request=response.request) from exc
        except httpx2.TransportError as exc:
            raise openai.APIConnectionError(request=response.request) from exc
    return folded.body()


class _LostTokens:
    """The tokens of a call's failed attempts that the provider may bill: one that timed out or lost its
    connection after the request went out had its prompt read, and maybe part of an answer written. No
    usage comes with those, so they are estimated (the context budget's estimate for the prompt, 4 characters
    a token for what was streamed): `Usage.estimated`. A refused
    connection or an HTTP error status cost nothing."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.usage = Usage()

    def attempt_failed(self, exc: BaseException, received_chars: int) -> None:
        import openai

        if not isinstance(exc, openai.APIConnectionError):  # an HTTP status error: nothing generated
            return
        if isinstance(exc.__cause__, (httpx2.ConnectError, httpx2.ConnectTimeout)):  # never sent
            return
        prompt = estimate_tokens(self.body.get("messages") or []) + estimate_tokens(self.body.get("tools") or [])
        self.usage = self.usage + Usage(prompt_tokens=prompt, completion_tokens=received_chars // 4, estimated=True)


def _outcome(exc: BaseException) -> str:
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection_error"
    if isinstance(exc, openai.RateLimitError):
        return "rate_limited"
    if isinstance(exc, openai.APIStatusError):
        if context_exceeded(exc.status_code, exc.body, exc.message):
            return CONTEXT_EXCEEDED
        return "server_error" if exc.status_code >= 500 else "client_error"
    return "error"


_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error", "context_window_exceeded",
                            "string_above_max_length"})  # fmt: skip
_CONTEXT_WORDS = ("maximum context length", "exceeds the available context size", "context length exceeded",
                  "context window", "exceed_context_size", "context_length_exceeded", "too many tokens in the prompt",
                  "prompt is too long")  # fmt: skip


def context_exceeded(status: int, body: object, message: str | None = None) -> bool:
    """Whether an HTTP error is the provider refusing a prompt larger than the model's context: llama.cpp's
    `exceed_context_size_error` (400), OpenAI's `context_length_exceeded` (400), vLLM's "This model's
    maximum context length is ..." (400). `body` is the decoded error body (its "error" object or the
    whole of it), `message` the client's message for it."""
    if status not in (400, 413, 422):
        return False
    error = body.get("error", body) if isinstance(body, dict) else body
    fields = [error.get("code"), error.get("type"), error.get("message")] if isinstance(error, dict) else [error]
    if any(isinstance(f, str) and f.strip().lower() in _CONTEXT_CODES for f in fields):
        return True
    text = " ".join(f for f in [*fields, message] if isinstance(f, str)).lower()
    return any(words in text for words in _CONTEXT_WORDS)


def _describe(exc: BaseException) -> str:
    """Status and type only: a provider's message may echo the prompt, an account or a URL, and this
    text is stored in the run and shown to its tenant."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        kind = exc.type if isinstance(getattr(exc, "type", None), str) else exc.__class__.__name__
        if context_exceeded(exc.status_code, exc.body, exc.message):
            return f"HTTP {exc.status_code} ({kind}): the prompt exceeds the model's context window"
        return f"HTTP {exc.status_code} ({kind})"
    return exc.__class__.__name__


class _Function(BaseModel):
    name: str | None = None
    arguments: str | None = None


class _Call(BaseModel):
    id: str | None = None
    function: _Function | None = None


class _Message(BaseModel):
    content: str | None = None
    tool_calls: list[_Call] | None = None
    reasoning_content: str | None = None  # a reasoning model's thinking (DeepSeek, vLLM, llama.cpp) ...
    reasoning: str | None = None  # ... as some providers name it (OpenRouter, Ollama)


class _Choice(BaseModel):
    message: _Message
    finish_reason: str | None = None


class _CompletionDetails(BaseModel):
    reasoning_tokens: int | None = None


class _Usage(BaseModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # reasoning tokens included
    completion_tokens_details: _CompletionDetails | None = None


class _Completion(BaseModel):
    """The part of a chat completion body we use (the provider is outside our trust boundary)."""

    model: str | None = None
    choices: list[_Choice] | None = None
    usage: _Usage | None = None


def parse_completion(body: bytes | str | dict[str, Any], attempts: int = 1, duration_ms: int = 0) -> LLMReply:
    """Validate a chat completion body (as received, or folded from a stream) and normalise it into the
    stored reply shape."""
    try:
        completion = (_Completion.model_validate(body) if isinstance(body, dict)
                      else _Completion.model_validate_json(body))
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"]) or "body"
        raise LLMError(f"the LLM answered with a malformed completion ({where}: {problem['msg']})",
                       attempts) from None
    if not completion.choices:
        return LLMReply(content=None, model=completion.model or "", attempts=attempts,
                        duration_ms=duration_ms, finish_reason="empty")
    choice = completion.choices[0]
    calls = [
        ToolCall(id=c.id or f"call-{i}", name=c.function.name or "", arguments=c.function.arguments or "")
        for i, c in enumerate(choice.message.tool_calls or [])
        if c.function is not None
    ]
    usage = completion.usage or _Usage()
    message = choice.message
    thinking, content = split_reasoning(message.content)  # <think>…</think> is never part of the answer
    details = usage.completion_tokens_details
    return LLMReply(
        content=content,
        tool_calls=calls,
        finish_reason=choice.finish_reason,
        model=completion.model or "",
        usage=Usage(prompt_tokens=usage.prompt_tokens or 0, completion_tokens=usage.completion_tokens or 0),
        duration_ms=duration_ms,
        attempts=attempts,
        reasoning=join_reasoning(message.reasoning_content or message.reasoning, thinking),
        reasoning_tokens=details.reasoning_tokens if details is not None else None,
    )
