"""Settings of the sandbox service, from the environment (prefix REACTQ_).

Defaults make a laptop work with nothing set: the backend is chosen automatically
(Docker when an engine answers, else the weaker process backend) and the tiers come
from deploy/sandbox/tiers.toml in the repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_TIERS_FILE = Path(__file__).resolve().parent / "tiers.toml"  # deploy/sandbox/tiers.toml links here


class SandboxSettings(BaseSettings):
    """Environment-driven configuration; construct with overrides in tests."""

    model_config = SettingsConfigDict(env_prefix="REACTQ_", extra="ignore")

    sandbox_backend: Literal["docker", "process", "auto"] = "auto"
    sandbox_image: str = "reactq-sandbox:latest"
    redis_url: str = "redis://127.0.0.1:6379/0"
    sandbox_tiers_file: Path = DEFAULT_TIERS_FILE
    # Containers kept warm per tier; a tier in the tiers file may override it.
    sandbox_pool_size: int = 2
    # Tiers that get a warm pool at start (empty = all tiers).
    sandbox_pool_tiers: str = ""
    # Interpreter the process backend runs (system python, not a virtualenv).
    sandbox_process_python: str = "/usr/bin/python3"
    # How the process backend confines code: bubblewrap, util-linux unshare (root only,
    # for hosts without bwrap), or auto = bwrap when installed, else unshare.
    sandbox_process_confinement: Literal["auto", "bwrap", "unshare"] = "auto"
    # Debian mirror for the offline image build; empty = the one apt uses here.
    sandbox_mirror: str = ""
