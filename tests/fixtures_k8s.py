"""deploy/k8s rendered by the real kustomize (`kubectl kustomize`, no flags), once per build per session."""

from __future__ import annotations

import functools
import shutil
import subprocess
from typing import Any

import yaml

from tests.fixtures_cluster import ROOT

K8S = ROOT / "deploy" / "k8s"
BUILDS = ("base", "autoscale-keda", "autoscale-hpa", "redis-cluster")
NAMESPACE = "reactq"


@functools.cache
def kustomize(build: str) -> tuple[dict[str, Any], ...]:
    """The objects `kubectl kustomize deploy/k8s/<build>` renders (what `kubectl apply -k` would send)."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (its built-in kustomize) is not installed"
    done = subprocess.run([kubectl, "kustomize", str(K8S / build)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)
