"""Build the compose stack's images with no registry: the reactq image, Redis, Prometheus, Alertmanager and
the Redis exporter.

Machines here cannot pull images, so (like the sandbox image, tools_sandbox/backends/image.py) everything starts
from a Debian bookworm root filesystem made by debootstrap and `docker import`ed as the base. The other
images are built FROM that local base with deploy/stack/*.Dockerfile:
- `reactq-redis`, `reactq-prometheus`, `reactq-alertmanager` and `reactq-redis-exporter` install Debian's
  packages (apt over the host's Debian mirror);
- `reactq` installs this project into a venv from wheels that pip built on the host (honouring the
  host's pip configuration); PyPI (through the host's CA bundle) supplies only what the image's Python
  needs beyond that (environment markers differ between Python patch releases).

Each tag is a hash of that image's inputs (the base's package list and mirror, the Dockerfile, the
dependency list, the sources), so an unchanged image is reused and a changed one gets a new tag.
Prints the tags as `KEY=VALUE` lines (the variables deploy/compose.test.yml reads), and writes them to
--env-file when given.

Usage: python3 scripts/build_stack_images.py [--env-file PATH] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import tomllib
from collections.abc import Iterable
from pathlib import Path

import certifi
import docker
import docker.errors

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools_sandbox.backends.image import SUITE, _run, _slim, apt_mirror, image_present  # noqa: E402
from tools_sandbox.base.errors import ImageBuildError  # noqa: E402

STACK_DIR = ROOT / "deploy" / "stack"
BASE_PACKAGES = ["python3", "python3-venv", "tini", "ca-certificates", "passwd"]
BASE_CHANGES = ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8",
                "LABEL org.reactq.stack.base=1"]
SOURCE_DIRS = ["worker", "tools_sandbox", "api_stub"]
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CONSTRAINTS = ROOT / "deploy" / "constraints.txt"  # the versions the suite passed with
WHEEL_CACHE = Path.home() / ".cache" / "reactq" / "stack-wheels"


def _digest(parts: Iterable[bytes | str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()[:16]


def _source_files() -> list[Path]:
    files = [ROOT / "pyproject.toml", ROOT / "README.md"]
    for d in SOURCE_DIRS:
        files += sorted(p for p in (ROOT / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                        and p.suffix != ".pyc")
    return files


def _dependencies() -> list[str]:
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def build_base(client: docker.DockerClient, mirror: str, force: bool) -> str:
    tag = f"reactq-base:{_digest([SUITE, mirror, *BASE_PACKAGES, *BASE_CHANGES])}"
    if image_present(client, tag) and not force:
        return tag
    print(f"debootstrap {SUITE} ({', '.join(BASE_PACKAGES)}) -> {tag}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="reactq-base-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
              SUITE, str(rootfs), mirror], "debootstrap")
        _slim(rootfs)
        tarball = Path(tmp) / "rootfs.tar"
        _run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."], "tar")
        repo, version = tag.split(":")
        client.api.import_image_from_file(str(tarball), repository=repo, tag=version, changes=BASE_CHANGES)
    return tag


def _wheelhouse(deps: list[str]) -> Path:
    """Every dependency as a wheel, built once per dependency list by the host's pip."""
    target = WHEEL_CACHE / _digest([*deps, CONSTRAINTS.read_bytes()])
    if (target / ".complete").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    print(f"pip wheel {len(deps)} dependencies -> {target}", file=sys.stderr)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(target), "-c", str(CONSTRAINTS), *deps], "pip wheel")
    (target / ".complete").touch()
    return target


def _docker_build(client: docker.DockerClient, context: Path, dockerfile: str, tag: str, base: str) -> None:
    print(f"docker build {dockerfile} -> {tag}", file=sys.stderr)
    try:
        client.images.build(path=str(context), dockerfile=dockerfile, tag=tag, buildargs={"BASE": base},
                            rm=True, forcerm=True, labels={"org.reactq.stack.inputs": tag.split(":")[1]})
    except docker.errors.BuildError as exc:
        tail = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in exc.build_log)[-3000:]
        raise SystemExit(f"docker build of {tag} failed: {exc}\n{tail}") from None


def build_service_image(client: docker.DockerClient, name: str, base: str, force: bool) -> str:
    dockerfile = STACK_DIR / f"{name}.Dockerfile"
    tag = f"reactq-{name}:{_digest([base, dockerfile.read_bytes()])}"
    if force or not image_present(client, tag):
        with tempfile.TemporaryDirectory(prefix=f"reactq-{name}-ctx-") as tmp:
            shutil.copy(dockerfile, Path(tmp) / "Dockerfile")
            _docker_build(client, Path(tmp), "Dockerfile", tag, base)
    return tag


def build_app_image(client: docker.DockerClient, base: str, force: bool) -> str:
    dockerfile = STACK_DIR / "app.Dockerfile"
    deps = _dependencies()
    sources = _source_files()
    tag = "reactq:" + _digest([base, dockerfile.read_bytes(), *deps, CONSTRAINTS.read_bytes(),
                               *(str(p.relative_to(ROOT)) for p in sources), *(p.read_bytes() for p in sources)])
    if image_present(client, tag) and not force:
        return tag
    wheels = _wheelhouse(deps)
    with tempfile.TemporaryDirectory(prefix="reactq-app-ctx-") as tmp:
        ctx = Path(tmp)
        shutil.copy(dockerfile, ctx / "Dockerfile")
        shutil.copytree(wheels, ctx / "wheels", ignore=shutil.ignore_patterns(".complete"))
        shutil.copy(CA_BUNDLE if CA_BUNDLE.exists() else certifi.where(), ctx / "ca.crt")
        (ctx / "requirements.txt").write_text("\n".join(deps) + "\n")
        shutil.copy(CONSTRAINTS, ctx / "constraints.txt")
        # The project's own wheel, from a clean copy of the sources (no build output in the worktree).
        src = ctx / "src"
        src.mkdir()
        for p in sources:
            dest = src / p.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(p, dest)
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(ctx / "app"), str(src)],
             "pip wheel (reactq)")
        shutil.rmtree(src)
        _docker_build(client, ctx, "Dockerfile", tag, base)
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-file", type=Path, default=None, help="also write the tags here")
    parser.add_argument("--force", action="store_true", help="rebuild even when the tags exist")
    args = parser.parse_args(argv)
    if shutil.which("debootstrap") is None:
        raise SystemExit("debootstrap is not installed (apt-get install -y debootstrap)")
    client = docker.from_env(timeout=900)
    try:
        base = build_base(client, apt_mirror(), args.force)
        tags = {
            "REACTQ_IMAGE": build_app_image(client, base, args.force),
            "REACTQ_REDIS_IMAGE": build_service_image(client, "redis", base, args.force),
            "REACTQ_PROMETHEUS_IMAGE": build_service_image(client, "prometheus", base, args.force),
            "REACTQ_ALERTMANAGER_IMAGE": build_service_image(client, "alertmanager", base, args.force),
            "REACTQ_REDIS_EXPORTER_IMAGE": build_service_image(client, "redis-exporter", base, args.force),
        }
    except (ImageBuildError, docker.errors.APIError) as exc:
        raise SystemExit(str(exc)) from None
    finally:
        client.close()
    text = "".join(f"{k}={v}\n" for k, v in tags.items())
    if args.env_file is not None:
        args.env_file.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
