"""`reactq sandbox ...`: try a tier by hand, build the image offline.

The group is added to the `reactq` command by the worker's CLI; `python -m
tools_sandbox.cli` (an alias of this module) runs it standalone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..base.config import SandboxSettings
from ..base.errors import ImageBuildError, SandboxError, UnknownTierError
from ..base.render import render
from .service import run_code


@click.group("sandbox")
def sandbox() -> None:
    """Run code in the sandbox, build its image."""


@sandbox.command("run")
@click.option("--tier", default="standard", show_default=True, help="tier from the tiers file")
@click.option("--tenant", default="default", show_default=True)
@click.option("--code", "code", default=None, help="Python source to run")
@click.option("--file", "file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="file with the Python source ('-' is not supported; use --code)")
@click.option("--json", "as_json", is_flag=True, help="print the result object as JSON")
@click.option("--backend", type=click.Choice(["docker", "process", "auto"]), default=None,
              help="default: REACTQ_SANDBOX_BACKEND, else docker")
@click.option("--redis-url", default=None, help="check the tenant's quotas on this Redis")
def run_cmd(tier: str, tenant: str, code: str | None, file: Path | None, as_json: bool,
            backend: str | None, redis_url: str | None) -> None:
    """Run code once in a fresh sandbox and print the result object."""
    if (code is None) == (file is None):
        raise click.UsageError("give exactly one of --code or --file")
    source = code if code is not None else file.read_text(encoding="utf-8")  # type: ignore[union-attr]
    try:
        result = run_code(source, tier=tier, tenant=tenant, backend=backend, redis_url=redis_url)
    except UnknownTierError as exc:
        raise click.BadParameter(str(exc), param_hint="--tier") from exc
    except SandboxError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(result.model_dump_json())
    else:
        click.echo(render(result).text)
        flags = [name for name in ("timed_out", "oom_killed", "truncated") if getattr(result, name)]
        click.echo(f"-- exit {result.exit_code} in {result.duration_ms} ms on {result.tier} "
                   f"({result.backend}){' ' + ','.join(flags) if flags else ''}", err=True)
    if result.error is not None:
        sys.exit(2)


@sandbox.command("build-image")
@click.option("--force", is_flag=True, help="rebuild even if the image exists")
@click.option("--tag", default=None, help="default: REACTQ_SANDBOX_IMAGE")
def build_image_cmd(force: bool, tag: str | None) -> None:
    """Build the sandbox image with no registry (debootstrap + docker import); reuse it if present."""
    from ..backends.image import build_with_local_engine

    settings = SandboxSettings()
    try:
        build_with_local_engine(tag or settings.sandbox_image, force=force, mirror=settings.sandbox_mirror,
                                log=lambda msg: click.echo(msg, err=True))
    except ImageBuildError as exc:
        raise click.ClickException(str(exc)) from exc
