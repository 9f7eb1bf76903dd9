"""reactq's exceptions, by whose fault they are. Each carries data; none logs.

    ReactqError
    ├── InvalidRequest      a submission that cannot run (the user's input; says what and where)
    ├── StoreUnavailable    Redis cannot be reached (names the URL)
    ├── LLMError            the LLM endpoint gave no reply after retries (the run ends `failed`)
    ├── LLMThrottled        the shared provider limit has no capacity soon enough (the step is re-queued)
    ├── ServiceError        `reactq demo` could not start or reach a service it needs
    ├── SignatureInvalid    a webhook's signature or timestamp did not verify (a receiver's check; says why)
    └── ToolError           a tool failed; the model hears it as an `Error: ...` observation
        └── InvalidArguments   the model's arguments did not validate (a model mistake)
"""

from __future__ import annotations


class ReactqError(Exception):
    """Root of reactq's own exceptions."""


class InvalidRequest(ReactqError, ValueError):
    """A submission that cannot run; the message says what was wrong and where."""


class StoreUnavailable(ReactqError):
    """Redis cannot be reached."""

    def __init__(self, url: str, cause: Exception) -> None:
        super().__init__(f"cannot reach Redis at {redact_url(url)}: {str(cause).rstrip('.')}")
        self.url = url


def redact_url(url: str) -> str:
    """The URL without its credentials: `redis://:secret@host:6379/0` -> `redis://host:6379/0`."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    return f"{scheme}://{rest.rpartition('@')[2]}"


class LLMError(ReactqError):
    """The endpoint could not give a reply (after retries)."""

    def __init__(self, message: str, attempts: int, outcome: str = "error") -> None:
        super().__init__(message)
        self.attempts = attempts
        self.outcome = outcome  # the last attempt's: server_error, timeout, connection_error, client_error, ...


class LLMThrottled(ReactqError):
    """No capacity for `model` within the limiter's bounded wait: try again after `wait_s`."""

    def __init__(self, model: str, reason: str, wait_s: float) -> None:
        super().__init__(f"{model}: no {reason} capacity for {wait_s:.1f}s")
        self.model = model
        self.reason = reason
        self.wait_s = wait_s


class ServiceError(ReactqError):
    """A service could not be started or reached."""


class SignatureInvalid(ReactqError):
    """A webhook delivery failed `worker.runtime.webhooks.verify`; `problem` is why (a `SignatureProblem` value:
    missing, malformed, stale, mismatch)."""

    def __init__(self, problem: str, message: str) -> None:
        super().__init__(message)
        self.problem = problem


class ToolError(ReactqError):
    """A tool failed in a way the model should hear about (becomes an `Error: ...` observation)."""

    def __init__(self, message: str, error_type: str = "tool_error") -> None:
        super().__init__(message)
        self.error_type = error_type


class InvalidArguments(ToolError):
    """The model's arguments for a tool did not validate."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "invalid_arguments")
