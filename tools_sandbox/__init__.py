"""tools_sandbox: executing untrusted code in locked-down sandboxes, with tiers and quotas.

Public API (checked by a test against `__all__`):

    run_code(code, *, tier, tenant, backend, redis_url) -> SandboxResult
    SandboxService        a worker's long-lived service (warm pool, quotas, metrics)
    SandboxResult, Tier   data
    load_tiers(path=None) the tiers file (deploy/sandbox/tiers.toml by default)
    SandboxSettings       REACTQ_* environment settings
    SandboxError ─┬─ UnknownTierError, TierConfigError
                  ├─ SandboxUnavailable
                  └─ ImageBuildError

Never imports `worker`: a sandbox worker host runs this package alone.
"""

from .config import SandboxSettings
from .errors import ImageBuildError, SandboxError, SandboxUnavailable, TierConfigError, UnknownTierError
from .models import SandboxResult, TenantQuota, Tier
from .service import SandboxService, run_code
from .tiers import load_tiers

__all__ = [
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
    "load_tiers",
    "run_code",
]
