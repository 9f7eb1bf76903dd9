"""reactq's exceptions, by whose fault they are. Each carries data; none logs. Every one is here.

    ReactqError
    ├── InvalidRequest       a submission that cannot run (the user's input; says what and where)
    │   ├── TierNotAllowed   the tenant's plan does not allow the tier asked for (HTTP 403)
    │   ├── StepOutOfRange   a replay from past the run's recorded steps (HTTP 409)
    │   └── ApprovalConflict no pending call matches an approval decision
    ├── AdmissionRefused     the tenant's plan does not admit it now (HTTP 429; `retry_after_s`)
    ├── TooLarge             a submission no plan limit will ever admit as it is (HTTP 422)
    │   └── ReportTooLarge   an eval report larger than REACTQ_EVAL_REPORT_MAX_BYTES (not stored; the file stays)
    ├── QuotaExceeded        the script recording runs found a quota full (becomes AdmissionRefused)
    ├── BudgetExceeded       a budget has no room for the next LLM call (the run ends `budget_exceeded`)
    ├── PlanConfigError      the plans file is missing or invalid (the operator's; named precisely)
    ├── PromptTemplateError  an operator's prompt template cannot be read, compiled or rendered
    ├── StoreUnavailable     Redis cannot be reached (names the URL, never its password)
    ├── LLMError             the LLM endpoint gave no reply after retries (the run ends `failed`)
    ├── LLMThrottled         the shared provider limit has no capacity soon enough (the step is re-queued)
    ├── ServiceError         `reactq demo` could not start or reach a service it needs
    ├── SignatureInvalid     a webhook's signature or timestamp did not verify (a receiver's check; says why)
    ├── WebhookUnreachable   a webhook's target could not be reached (a typed attempt error, no exception text)
    └── ToolError            a tool failed; the model hears it as an `Error: ...` observation
        └── InvalidArguments the model's arguments did not validate (a model mistake)
"""

from __future__ import annotations

from typing import Any


class ReactqError(Exception):
    """Root of reactq's own exceptions."""


class InvalidRequest(ReactqError, ValueError):
    """A submission that cannot run; the message says what was wrong and where."""


class StepOutOfRange(InvalidRequest):
    """A replay from past the steps the run has recorded (the HTTP API answers 409: it depends on the run)."""


class TierNotAllowed(InvalidRequest):
    """The tenant's plan does not allow the tier asked for (the HTTP API answers 403)."""


class ApprovalConflict(InvalidRequest):
    """The run has no pending call that matches the decision (not waiting, or an unknown call id)."""


class AdmissionRefused(ReactqError):
    """A submission or stream the tenant's plan does not admit now; `retry_after_s` says when to retry."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, retry_after_s)


class TooLarge(ReactqError):
    """A submission that can never be admitted as it is (more runs than the plan has in flight)."""


class ReportTooLarge(TooLarge):
    """An eval report's HTML is larger than the store keeps (the setting that says how large is named)."""


class QuotaExceeded(ReactqError):
    """A quota said no (nothing was written); `limit` is "in_flight" or "per_minute". `quota` is the
    store's `Quota` that was checked."""

    def __init__(self, quota: Any, limit: str) -> None:
        super().__init__(f"{quota.tenant}: {limit}")
        self.quota, self.limit = quota, limit


class BudgetExceeded(ReactqError):
    """A budget has no room for the next LLM call; the run ends `budget_exceeded`."""

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PlanConfigError(ReactqError):
    """The plans file is missing, unreadable or invalid (an operator's mistake, named precisely)."""


class PromptTemplateError(ReactqError, ValueError):
    """An operator's prompt template cannot be read, compiled or rendered."""


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

    def __init__(self, message: str, attempts: int, outcome: str = "error", retry_after_s: float | None = None,
                 lost_usage: Any = None) -> None:
        super().__init__(message)
        self.attempts = attempts
        # a worker.core.models.Usage (this module imports nothing of the package): the tokens of failed
        # attempts the provider may bill, estimated
        self.lost_usage = lost_usage
        self.outcome = outcome  # the last attempt's: server_error, timeout, connection_error, client_error, ...
        self.retry_after_s = retry_after_s  # when to try again, if the provider (or its circuit) says


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


class WebhookUnreachable(ReactqError):
    """A webhook's target could not be reached; `attempt_delivery` records `kind` (an `AttemptError`
    value) as the attempt's typed error."""

    def __init__(self, kind: str, message: str, address: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.address = address


class ToolError(ReactqError):
    """A tool failed in a way the model should hear about (becomes an `Error: ...` observation)."""

    def __init__(self, message: str, error_type: str = "tool_error") -> None:
        super().__init__(message)
        self.error_type = error_type


class InvalidArguments(ToolError):
    """The model's arguments for a tool did not validate."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "invalid_arguments")
