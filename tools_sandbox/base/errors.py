"""Exceptions of tools_sandbox: one root, each carrying data, none logging.

    SandboxError
    ├── UnknownTierError        a tier name not in the tiers file (names the known tiers)
    ├── TierConfigError         the tiers file is missing or invalid
    ├── SandboxUnavailable      no backend can run code here (engine gone, bwrap missing)
    │   └── TierUnavailable     this backend cannot give one tier its limits (a runtime, a memory cap)
    └── ImageBuildError         the offline image build failed

A failure of the *code* under test is never an exception: it is a SandboxResult.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Root of every exception raised by tools_sandbox."""


class UnknownTierError(SandboxError, ValueError):
    """The requested tier is not defined; `known` lists the tiers that are."""

    def __init__(self, tier: str, known: list[str]) -> None:
        self.tier = tier
        self.known = known
        super().__init__(f"unknown sandbox tier {tier!r}; known tiers: {', '.join(known) or '(none)'}")


class TierConfigError(SandboxError):
    """The tiers file cannot be read or does not validate."""


class SandboxUnavailable(SandboxError):
    """The chosen backend cannot execute anything right now (infrastructure, not the code)."""


class TierUnavailable(SandboxUnavailable):
    """This backend cannot run `tier` with its limits (another worker's may): the tier is refused rather
    than run with weaker isolation; the backend still serves its other tiers."""

    def __init__(self, tier: str, why: str) -> None:
        self.tier = tier
        self.why = why
        super().__init__(f"tier {tier} is unavailable on this sandbox worker: {why}")


class ImageBuildError(SandboxError):
    """Building the sandbox image without a registry failed."""
