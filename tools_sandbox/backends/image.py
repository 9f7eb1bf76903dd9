"""Building the sandbox image with no registry: debootstrap + `docker import`.

Machines here cannot pull images, so the image is a Debian bookworm root filesystem
(minbase + python3, numpy, tini) bootstrapped from the same mirror apt already uses,
imported as `reactq-sandbox:latest`. deploy/sandbox/Dockerfile builds the same thing
where a registry is reachable. An existing image is reused unless `force`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import docker
import docker.errors

from ..base.errors import ImageBuildError

PACKAGES = ["python3", "python3-numpy", "tini", "ca-certificates"]
SUITE = "bookworm"
FALLBACK_MIRROR = "http://deb.debian.org/debian"
# Applied by `docker import`; the backend sets user, env and limits again per container.
IMAGE_CHANGES = [
    "USER 65534:65534",
    "WORKDIR /tmp",
    "ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 HOME=/tmp",
    'ENTRYPOINT ["/usr/bin/tini", "--"]',
    'CMD ["python3"]',
    "LABEL org.reactq.sandbox.image=1",
]


def apt_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian (not -security) mirror apt is configured with, so the build uses the same one."""
    candidates: list[Path] = [sources_dir / "sources.list"]
    candidates += sorted((sources_dir / "sources.list.d").glob("*.sources"))
    candidates += sorted((sources_dir / "sources.list.d").glob("*.list"))
    for path in candidates:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        # deb822 stanzas: URIs + Suites naming bookworm.
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and SUITE in suites.group(1).split() and "security" not in uris.group(1):
                return uris.group(1).rstrip("/")
        for line in text.splitlines():
            m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line.strip())
            if m and m.group(2) == SUITE and "security" not in m.group(1):
                return m.group(1).rstrip("/")
    return FALLBACK_MIRROR


def image_present(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_image(
    client: docker.DockerClient,
    tag: str,
    *,
    force: bool = False,
    mirror: str = "",
    log: Callable[[str], None] = print,
) -> bool:
    """Build `tag` offline unless it exists; return True when a build happened."""
    if not force and image_present(client, tag):
        log(f"image {tag} already present; reusing it (--force rebuilds)")
        return False
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed (apt-get install -y debootstrap)")
    mirror = mirror or apt_mirror()
    repo, _, version = tag.rpartition(":") if ":" in tag.split("/")[-1] else (tag, "", "latest")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reactq-sandbox-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"debootstrap {SUITE} from {mirror} (packages: {', '.join(PACKAGES)})")
        _run([
            "debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
            SUITE, str(rootfs), mirror,
        ], "debootstrap")
        _slim(rootfs)
        tarball = Path(tmp) / "rootfs.tar"
        _run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."], "tar")
        log(f"docker import -> {repo}:{version}")
        try:
            client.api.import_image_from_file(
                str(tarball), repository=repo, tag=version, changes=IMAGE_CHANGES,
            )
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"docker import failed: {exc}") from exc
    if not image_present(client, tag):
        raise ImageBuildError(f"docker import reported success but {tag} is not there")
    log(f"built {tag} in {time.monotonic() - started:.0f}s")
    return True


def build_with_local_engine(tag: str, *, force: bool = False, mirror: str = "",
                            log: Callable[[str], None] = print) -> bool:
    """`build_image` on this host's Docker engine (the CLI's form); ImageBuildError when no engine answers."""
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except docker.errors.DockerException as exc:
        raise ImageBuildError(f"no Docker engine answers ({exc}); run scripts/start-dockerd.sh") from exc
    try:
        return build_image(client, tag, force=force, mirror=mirror, log=log)
    finally:
        client.close()


def _slim(rootfs: Path) -> None:
    """Drop caches and docs: smaller image, nothing the sandbox needs."""
    for rel in ["var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                "usr/share/info", "usr/share/locale", "var/log"]:
        d = rootfs / rel
        if d.is_dir():
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-20:])
        raise ImageBuildError(f"{what} failed (exit {proc.returncode}):\n{tail}")
