"""tools_sandbox: executing untrusted code in locked-down sandboxes, with tiers and quotas.

Public API (checked by a test against `__all__`):

    run_code(code, *, tier, tenant, backend, redis_url) -> SandboxResult
    SandboxService        a worker's long-lived service (warm pool, quotas, metrics)
    SandboxResult, Tier   data (ErrorKind: the closed set of a result's `error_kind`)
    ExecuteRequest        what a step sends the sandbox task (its answer: a SandboxResult)
    SessionCell           an earlier cell of a python session, replayed before the request's code
    render_result(result) -> Rendered   the one text a model sees for a result
    load_tiers(path=None) the tiers file (deploy/sandbox/tiers.toml by default)
    SandboxSettings       REACTQ_* environment settings
    backend_up() -> bool  whether this process's sandbox backend can run code now (its heartbeat asks)
    SandboxError ─┬─ UnknownTierError, TierConfigError
                  ├─ SandboxUnavailable
                  └─ ImageBuildError

Never imports `worker`: a sandbox worker host runs this package alone.

Layers, bottom first (tests/test_layering.py checks imports go down only):

    inside/    what runs inside the sandbox: the supervisor (_agent.py), standard library only
    base/      models, errors, settings, tiers, the wire protocol, keys, quotas (Redis), metrics,
               the renderer, the seam a backend implements
    backends/  Docker, the warm pool, the process backend, cgroup reading, the image build
    edges/     the service (constructs the backends), backend health, the Celery task, the CLI

Importing a name loads its module then (PEP 562), so `import tools_sandbox.base.names` (worker/names.py)
loads nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base.config import SandboxSettings
    from .base.errors import ImageBuildError, SandboxError, SandboxUnavailable, TierConfigError, UnknownTierError
    from .base.models import ErrorKind, SandboxResult, TenantQuota, Tier
    from .base.render import Rendered
    from .base.render import render as render_result
    from .base.request import ExecuteRequest
    from .base.session import SessionCell
    from .base.tiers import load_tiers
    from .edges.health import backend_up
    from .edges.service import SandboxService, run_code

# Each public name: the module it lives in, and its name there.
_PUBLIC = {
    "SandboxSettings": (".base.config", "SandboxSettings"),
    **{name: (".base.errors", name) for name in
       ("ImageBuildError", "SandboxError", "SandboxUnavailable", "TierConfigError", "UnknownTierError")},
    **{name: (".base.models", name) for name in ("ErrorKind", "SandboxResult", "TenantQuota", "Tier")},
    "Rendered": (".base.render", "Rendered"),
    "ExecuteRequest": (".base.request", "ExecuteRequest"),
    "SessionCell": (".base.session", "SessionCell"),
    "render_result": (".base.render", "render"),
    "load_tiers": (".base.tiers", "load_tiers"),
    "backend_up": (".edges.health", "backend_up"),
    "SandboxService": (".edges.service", "SandboxService"),
    "run_code": (".edges.service", "run_code"),
}


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tools_sandbox' has no attribute {name!r}")
    module, attr = _PUBLIC[name]
    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value
    return value


__all__ = [
    "ErrorKind",
    "ExecuteRequest",
    "Rendered",
    "render_result",
    "ImageBuildError",
    "SandboxError",
    "SandboxResult",
    "SandboxService",
    "SessionCell",
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
