"""`reactq demo`: the sample batch on the embedded default, starting (and afterwards stopping) whatever
is missing: Redis, api_stub, a step worker, a sandbox worker."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .core.models import Run
from .names import SANDBOX_QUEUE, STEPS_QUEUE
from .services import Started, http_ok, redis_reachable, start_redis, start_stub, start_worker


def sample_batch_path() -> Path:
    return Path(str(resources.files("worker").joinpath("data/sample_batch.jsonl")))


def is_correct(answer: str | None, expected: str) -> bool:
    return answer is not None and expected.lower() in answer.lower()


def run_demo(outfile: Path, console: Console, out: Console) -> int:
    from .batch_cli import run_batch_file
    from .runtime import get_runtime
    from .tasks import send_step

    rt = get_runtime()
    s = rt.settings
    workdir = Path(tempfile.mkdtemp(prefix="reactq-demo-"))
    started: list[Started] = []
    try:
        if not redis_reachable(s.redis_url):
            console.print(f"starting redis-server for {s.redis_url}")
            started.append(start_redis(s.redis_url, workdir))
        if not http_ok(s.llm_base_url.rstrip("/") + "/models"):
            console.print(f"starting api_stub at {s.llm_base_url}")
            started.append(start_stub(s.llm_base_url, workdir))
        for queue, name in ((STEPS_QUEUE, "steps"), (SANDBOX_QUEUE, "sandbox")):
            if rt.cluster.live_workers(queue) == 0:
                console.print(f"starting a {name} worker (log: {workdir}/worker-{name}.log)")
                # The demo alone opts into `auto`: Docker when an engine answers, else the weaker process
                # backend, which every result then names (production's default is docker, fail closed).
                env = {"REACTQ_SANDBOX_BACKEND": os.environ.get("REACTQ_SANDBOX_BACKEND", "auto")}
                started.append(start_worker(name, 64 if name == "steps" else 2, workdir, env=env))
        if outfile.exists():
            outfile.unlink()
        sample = sample_batch_path()
        expected = {}
        for line in sample.read_text(encoding="utf-8").splitlines():
            if line.strip():
                item = json.loads(line)
                expected[item["id"]] = (item["question"], item.get("expected", ""))
        results: list[Run] = []
        t0 = time.monotonic()
        code = run_batch_file(rt, sample, outfile, None, None, send_step, console, on_result=results.append)
        elapsed = time.monotonic() - t0
        _summary(out, results, expected, elapsed, outfile)
        if code == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            console.print(f"service logs are in {workdir}")
        return code
    finally:
        for service in reversed(started):
            service.stop()


def _summary(out: Console, results: list[Run], expected: dict[str, tuple[str, str]], elapsed: float,
             outfile: Path) -> None:
    table = Table(title="reactq demo", show_lines=False)
    for column in ("id", "question", "answer", "status", "steps", "tokens", "ok"):
        table.add_column(column, overflow="fold")
    right = 0
    for run in sorted(results, key=lambda r: r.spec.client_id or ""):
        question, want = expected.get(run.spec.client_id or "", ("", ""))
        ok = is_correct(run.answer, want)
        right += ok
        table.add_row(run.spec.client_id, question[:60], (run.answer or run.error or "")[:60], run.status.value,
                      str(run.current_step), str(run.usage.prompt_tokens + run.usage.completion_tokens),
                      "[green]✓[/green]" if ok else "[red]✗[/red]")
    out.print(table)
    tokens = sum(r.usage.prompt_tokens + r.usage.completion_tokens for r in results)
    cost = sum(r.cost_usd for r in results)
    out.print(f"[bold]{right}/{len(expected)} correct[/bold] · {len(results)} runs in {elapsed:.1f}s · "
              f"{tokens} tokens · ${cost:.5f} · results in {outfile}")
