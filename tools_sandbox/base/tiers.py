"""Loading tier definitions from the TOML tiers file (stdlib tomllib, no YAML dependency)."""

from __future__ import annotations

import re
import tomllib
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from .errors import TierConfigError, UnknownTierError
from .models import Tier


def parse_tiers(text: str, source: str = "<string>") -> dict[str, Tier]:
    """Parse `[tiers.<name>]` tables (each with a `[tiers.<name>.quota]`) into Tier objects."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TierConfigError(f"{source}: invalid TOML: {exc}") from exc
    raw = data.get("tiers")
    if not isinstance(raw, dict) or not raw:
        raise TierConfigError(f"{source}: no [tiers.<name>] tables")
    tiers: dict[str, Tier] = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict):
            raise TierConfigError(f"{source}: tiers.{name} must be a table")
        try:
            tiers[name] = Tier(name=name, **spec)
        except ValidationError as exc:
            raise TierConfigError(f"{source}: tier {name!r} is invalid: {exc}") from exc
    return tiers


def requiring_runtime(text: str, runtime: str) -> str:
    """A tiers file's text with every tier requiring the OCI runtime `runtime` (for "runc", the engine's
    default, the text as it is): how the tests and benchmarks run one tiers file on gVisor too."""
    if runtime == "runc":
        return text
    return re.sub(r"^(\[tiers\.[A-Za-z0-9_-]+\])$", rf'\1\nruntime = "{runtime}"', text, flags=re.M)


@lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int) -> dict[str, Tier]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TierConfigError(f"cannot read tiers file {path}: {exc}") from exc
    return parse_tiers(text, source=path)


def load_tiers(path: str | Path | None = None) -> dict[str, Tier]:
    """All tiers from `path` (default: the shipped tiers file; the settings name another), re-read when the
    file changes."""
    from .config import DEFAULT_TIERS_FILE

    p = Path(path) if path is not None else DEFAULT_TIERS_FILE
    try:
        mtime = p.stat().st_mtime_ns
    except OSError as exc:
        raise TierConfigError(f"cannot read tiers file {p}: {exc}") from exc
    return dict(_load_cached(str(p), mtime))


def get_tier(name: str, tiers: dict[str, Tier]) -> Tier:
    """The tier called `name`, or UnknownTierError naming the known tiers."""
    try:
        return tiers[name]
    except KeyError:
        raise UnknownTierError(name, sorted(tiers)) from None
