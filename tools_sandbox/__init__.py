"""tools_sandbox: executing untrusted code in locked-down sandboxes, with tiers and quotas.

Public API (checked by a test against `__all__`):

    run_code(code, *, tier, tenant, backend, redis_url) -> SandboxResult
    SandboxService        a worker's long-lived service (warm pool, quotas, metrics)
    SandboxResult, Tier   data (ErrorKind: the closed set of a result's `error_kind`)
    render_result(result) -> Rendered   the one text a model sees for a result
    load_tiers(path=None) the tiers file (deploy/sandbox/tiers.toml by default)
    SandboxSettings       REACTQ_* environment settings
    backend_up() -> bool  whether this process's sandbox backend can run code now (its heartbeat asks)
    SandboxError ─┬─ UnknownTierError, TierConfigError
                  ├─ SandboxUnavailable
                  └─ ImageBuildError

Never imports `worker`: a sandbox worker host runs this package alone.
"""

from .config import SandboxSettings
from .errors import ImageBuildError, SandboxError, SandboxUnavailable, TierConfigError, UnknownTierError
from .health import backend_up
from .models import ErrorKind, SandboxResult, TenantQuota, Tier
from .render import Rendered
from .render import render as render_result
from .service import SandboxService, run_code
from .tiers import load_tiers

__all__ = [
    "ErrorKind",
    "Rendered",
    "render_result",
    "ImageBuildError",
    "SandboxError",
    "SandboxResult",
    "SandboxService",
    "SandboxSettings",
    "SandboxUnavailable",
    "TenantQuota",
    "Tier",
    "TierConfigError",
    "UnknownTierError",
    "backend_up",
    "load_tiers",
    "run_code",
]
