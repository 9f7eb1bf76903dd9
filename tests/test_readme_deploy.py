"""The README's "Deploying to Kubernetes" section runs as written: every `kubectl apply -k PATH` in it is built
by the real kustomize (`kubectl kustomize PATH`, no flags) and the output checked by the real
`kubernetes-validate --strict` for every Kubernetes version from 1.29 to 1.37; custom resources it cannot know
(KEDA's) are checked against the CRDs vendored under tests/schemas/. Every build under deploy/k8s must be
named there, and the secrets the section creates must be the ones the manifests read."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures_cluster import ROOT
from tests.fixtures_crds import crd_errors, crd_schemas

SECTION = "## Deploying to Kubernetes"
K8S_VERSIONS = [f"1.{minor}.0" for minor in range(29, 38)]
UNKNOWN_KIND = re.compile(r"^WARN \S+ Couldn't find schema for kind (\S+) with api version (\S+) for kubernetes")


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    assert text.count(f"\n{SECTION}\n") == 1, f"README.md has no single {SECTION!r} section"
    return text.split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]


def commands() -> list[str]:
    """The shell lines of the section's code blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", readme_section(), re.S)
    return [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()
            if line.strip() and not line.strip().startswith("#")]


APPLIED = [m for c in commands() for m in re.findall(r"^kubectl apply -k (\S+)", c)]


@functools.cache
def render(path: str) -> str:
    """What `kubectl kustomize PATH` prints (what `kubectl apply -k PATH` would send)."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) is not installed"
    built = subprocess.run([kubectl, "kustomize", str(ROOT / path)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return built.stdout


def test_every_build_under_deploy_k8s_is_in_the_readme() -> None:
    builds = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "deploy" / "k8s").rglob("kustomization.yaml")}
    assert builds, "no kustomization.yaml under deploy/k8s"
    assert "deploy/k8s/base" in APPLIED
    assert sorted(builds - set(APPLIED)) == [], "builds the README does not say how to apply"
    assert sorted(set(APPLIED) - builds) == [], "README paths that are not builds"


@pytest.mark.parametrize("path", APPLIED)
def test_readme_build_renders_and_validates(path: str, tmp_path: Path) -> None:
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(render(path))
    docs = [d for d in yaml.safe_load_all(render(path)) if d]
    assert docs
    validate = shutil.which("kubernetes-validate")
    assert validate, "kubernetes-validate is not installed (pip install -e '.[test]')"
    checked = subprocess.run([validate, "--strict", "--quiet", *[a for v in K8S_VERSIONS for a in ("-k", v)],
                              str(rendered)], capture_output=True, text=True, timeout=300)
    lines = [line for line in (checked.stdout + checked.stderr).splitlines() if line.strip()]
    assert checked.returncode == 0, "\n".join(lines)
    unknown = {m.group(2, 1) for line in lines if (m := UNKNOWN_KIND.match(line))}
    assert [line for line in lines if not UNKNOWN_KIND.match(line)] == []
    # What kubernetes-validate has no schema for are custom resources: each checked against its vendored CRD.
    custom = [d for d in docs if (d["apiVersion"], d["kind"]) in unknown]
    assert {(d["apiVersion"], d["kind"]) for d in custom} == unknown
    missing = sorted(unknown - set(crd_schemas()))
    assert missing == [], "no CRD vendored under tests/schemas/ for these"
    assert {f"{d['kind']}/{d['metadata']['name']}": crd_errors(d) for d in custom} == {
        f"{d['kind']}/{d['metadata']['name']}": [] for d in custom}


def _secret_refs(node: Any) -> set[tuple[str, str]]:
    """(secret, key) every pod env, volume or KEDA TriggerAuthentication of a build reads (optional ones aside)."""
    found: set[tuple[str, str]] = set()
    if isinstance(node, dict):
        ref = node.get("secretKeyRef")
        if isinstance(ref, dict) and not ref.get("optional"):
            found.add((ref["name"], ref["key"]))
        for target in node.get("secretTargetRef", []) if isinstance(node.get("secretTargetRef"), list) else []:
            found.add((target["name"], target["key"]))
        for value in node.values():
            found |= _secret_refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= _secret_refs(value)
    return found


def created_secrets() -> set[tuple[str, str]]:
    """(secret, key) the section's `kubectl create secret generic` lines make (a `for r in ...` loop included)."""
    made = set()
    for command in commands():
        m = re.match(r"kubectl -n reactq create secret generic (\S+) (.*)", command)
        if m:
            name, rest = m.groups()
            loop = re.search(r"\$\(for \w+ in ([^;]+);", rest)
            keys = loop.group(1).split() if loop else re.findall(r"--from-literal=([\w.-]+)=", rest)
            made |= {(name, key) for key in keys}
    return made


def test_the_readme_creates_every_secret_key_the_manifests_read() -> None:
    shipped = set()
    read = set()
    for path in APPLIED:
        docs = [d for d in yaml.safe_load_all(render(path)) if d]
        shipped |= {(d["metadata"]["name"], k) for d in docs if d["kind"] == "Secret"
                    for k in {**d.get("data", {}), **d.get("stringData", {})}}
        read |= _secret_refs(docs)
    assert read, "no secret references found: the walk is broken"
    assert sorted(read - shipped - created_secrets()) == []
    # One Redis password per ACL user of deploy/redis/acl.conf (the default user is off), none extra.
    users = set(re.findall(r"^user (\S+) on ", (ROOT / "deploy" / "redis" / "acl.conf").read_text(), re.M))
    assert {key for name, key in created_secrets() if name == "reactq-redis"} == users
