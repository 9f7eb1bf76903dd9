"""Deploy honesty for the sandbox worker: no LLM key, and (Kubernetes) a dedicated, tainted node pool."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _k8s_docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "base" / name).read_text()) if d]


def test_compose_gives_the_llm_key_to_model_callers_only() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert "REACTQ_LLM_API_KEY" not in services["sandbox-worker"]["environment"]
    assert "REACTQ_LLM_API_KEY" in services["step-worker"]["environment"]
    assert not any("KEY" in name for name in services["sandbox-worker"]["environment"])


def test_k8s_sandbox_worker_has_no_llm_secret_and_its_own_tainted_pool() -> None:
    deployment = next(d for d in _k8s_docs("sandbox-worker.yaml") if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    for container in pod["containers"] + pod.get("initContainers", []):
        assert all("secretRef" not in source for source in container.get("envFrom", [])), container["name"]
        assert not any("KEY" in env["name"] for env in container.get("env", [])), container["name"]
    assert pod["nodeSelector"] == {"reactq.io/pool": "sandbox"}
    toleration = {"key": "reactq.io/sandbox", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    assert toleration in pod["tolerations"]
    assert pod["automountServiceAccountToken"] is False
    # Nothing else tolerates the sandbox taint, so nothing else lands on those nodes.
    for name in ("api.yaml", "step-worker.yaml", "redis.yaml", "stub.yaml", "prometheus.yaml", "grafana.yaml"):
        for doc in _k8s_docs(name):
            spec = (doc.get("spec") or {}).get("template", {}).get("spec", {})
            assert "reactq.io/sandbox" not in str(spec.get("tolerations", [])), name
