"""The `reactq` command line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from ..config import get_settings
from ..names import SANDBOX_QUEUE, STEPS_QUEUE
from . import tenants as cli_tenants
from .base import _load, _runtime, _send_step, cli, console, out


@cli.command()
@click.option("--queues", default="steps,sandbox", show_default=True, help="steps, sandbox, or both")
@click.option("--concurrency", "-c", type=int, default=None, help="threads (default: 200 for steps, cores for sandbox)")
@click.option("--metrics-port", type=int, default=None, help="port of /metrics (0: none; default REACTQ_METRICS_PORT)")
@click.option("--processes", "-p", type=int, default=1, show_default=True,
              help="worker processes to run (one Python process is GIL-bound: use about 2 per core for steps); "
                   "process i serves /metrics on metrics-port + i")
@click.option("--loglevel", default="INFO", show_default=True)
def worker(queues: str, concurrency: int | None, metrics_port: int | None, processes: int, loglevel: str) -> None:
    """A Celery worker for the reactq queues (a threads pool: LLM calls and sandbox runs are waits)."""
    if processes > 1:
        from .local_stack import supervise_workers

        port = get_settings().metrics_port if metrics_port is None else metrics_port
        sys.exit(supervise_workers(processes, queues, concurrency, port, loglevel))
    from .. import logs
    from ..names import WEBHOOKS_QUEUE
    from ..runtime.metrics_server import start_metrics_server

    names = {"steps": STEPS_QUEUE, "sandbox": SANDBOX_QUEUE, "webhooks": WEBHOOKS_QUEUE}
    try:
        selected = [names[q.strip()] for q in queues.split(",") if q.strip()]
    except KeyError as exc:
        message = f"unknown queue {exc.args[0]!r}; use steps, sandbox, webhooks (comma-separated)"
        raise click.BadParameter(message, param_hint="--queues") from None
    if STEPS_QUEUE in selected and WEBHOOKS_QUEUE not in selected:  # step workers deliver webhooks by default
        selected.append(WEBHOOKS_QUEUE)
    if concurrency is None:
        concurrency = 200 if STEPS_QUEUE in selected else (os.cpu_count() or 2)
    os.environ["REACTQ_WORKER_QUEUES"] = ",".join(selected)
    logs.setup(loglevel)
    rt = _runtime(patient=True)
    port = rt.settings.metrics_port if metrics_port is None else metrics_port
    if port:
        start_metrics_server(port, rt)
    from ..tasks.app import app

    app.worker_main([
        "worker", "-Q", ",".join(selected), "-P", "threads", "-c", str(concurrency),
        "--loglevel", loglevel, "-n", f"reactq-{'-'.join(q.split('.')[-1] for q in selected)}-{os.getpid()}@%h",
        "--without-gossip", "--without-mingle",
    ])


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8900, show_default=True)
@click.option("--faults", "faults_json", default="{}", help='fault injection as JSON, e.g. {"latency_ms": 200}')
@click.option("--latency-ms", type=float, default=None)
@click.option("--error-rate-429", type=float, default=None)
@click.option("--error-rate-500", type=float, default=None)
@click.option("--error-rate-503", type=float, default=None)
@click.option("--malformed-rate", type=float, default=None)
@click.option("--hallucinate-rate", type=float, default=None)
@click.option("--seed", type=int, default=None)
@click.option("--rpm-limit", type=int, default=None, help="server-side requests per minute (429 + Retry-After over it)")
@click.option("--tpm-limit", type=int, default=None, help="server-side tokens per minute (429 + Retry-After over it)")
def stub(host: str, port: int, faults_json: str, **options: float | None) -> None:
    """The api_stub OpenAI-compatible server (deterministic ReAct model, fault injection)."""
    from api_stub.server import FaultConfig, serve

    fields = json.loads(faults_json)
    fields.update({k: v for k, v in options.items() if v is not None})
    serve(host, port, FaultConfig(**fields))


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--insecure-no-auth", is_flag=True,
              help="no API keys: every caller acts as the first tenant of REACTQ_TENANTS (binds 127.0.0.1 only)")
def api(host: str, port: int, insecure_no_auth: bool) -> None:
    """The HTTP API (FastAPI): runs, batches, events, /metrics. Needs a tenant with an API key."""
    import uvicorn

    from .. import logs

    logs.setup()
    rt = _runtime()
    if insecure_no_auth:
        from ..api.auth import serve_without_keys

        serve_without_keys(rt.settings.tenants[0])
        host = "127.0.0.1"
        console.print("[yellow]warning:[/yellow] --insecure-no-auth: no API keys are checked; serving on 127.0.0.1")
    elif rt.tenants.registered_count() == 0:
        console.print("[red]error:[/red] no tenant has been set up, so no request could be authorised. Add one:\n"
                      "  reactq tenant add NAME --plan standard && reactq key create NAME\n"
                      "(or run `reactq api --insecure-no-auth` for a local, loopback-only API without keys)")
        sys.exit(2)
    uvicorn.run("worker.api.app:app", host=host, port=port, log_level="warning", backlog=4096)


@cli.command()
@click.argument("question")
@click.option("--wait", is_flag=True, help="wait for the answer")
@click.option("--json", "as_json", is_flag=True)
@click.option("--tenant", default="default", show_default=True)
@click.option("--tier", default=None, help="default: the tenant's plan's default tier")
@click.option("--max-steps", type=int, default=None)
@click.option("--model", default=None, help="default: REACTQ_MODEL; others from REACTQ_MODELS")
@click.option("--timeout", type=float, default=600, show_default=True, help="seconds to --wait")
@click.option("--webhook-url", default=None, help="called with the run when it finishes")
def ask(question: str, wait: bool, as_json: bool, tenant: str, tier: str | None, max_steps: int | None,
        model: str | None, timeout: float, webhook_url: str | None) -> None:
    """Submit one run."""
    from ..core.models import RunSpec
    from ..core.views import run_json
    from ..errors import InvalidRequest
    from ..service.batch import BatchRunner
    from ..service.submit import submit, tenant_policy
    from ..tenancy.admission import AdmissionRefused, TooLarge

    rt = _runtime()
    try:
        tier = tier or tenant_policy(rt.tenants, tenant).plan.default_tier or "standard"
        [run] = submit(rt.store, [RunSpec(question=question, tenant=tenant, tier=tier, max_steps=max_steps,
                                          model=model, webhook_url=webhook_url)], rt.settings, _send_step(),
                       interactive=True)
    except (InvalidRequest, AdmissionRefused, TooLarge) as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    if wait:
        BatchRunner(rt.store, rt.settings, _send_step()).follow([run.id], lambda r: None, lambda p: None,
                                                                 timeout_s=timeout)
        run = rt.store.load_run(run.id) or run
    if as_json:
        out.print_json(json.dumps(run_json(run)))
    elif wait:
        out.print(run.answer if run.answer is not None else f"[{run.status.value}] {run.error or ''}")
    else:
        out.print(run.id)
    if wait and run.status.value != "succeeded":
        sys.exit(1)


@cli.command()
@click.argument("infile", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "outfile", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--tenant", default=None, help="default tenant for lines without one")
@click.option("--tier", default=None, help="default tier for lines without one")
def batch(infile: Path, outfile: Path, tenant: str | None, tier: str | None) -> None:
    """Run many questions from JSONL; results are written to --out as they finish."""
    from ..tasks.steps import sending_together
    from .batch_progress import run_batch_file

    rt = _runtime()
    sys.exit(run_batch_file(rt, infile, outfile, tenant, tier, _send_step(), console, send_together=sending_together))


@cli.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
def status(run_id: str, as_json: bool) -> None:
    """Show a run's state."""
    from ..core.views import run_json
    from .display import print_status

    run = _load(run_id)
    if as_json:
        out.print_json(json.dumps(run_json(run)))
    else:
        print_status(out, run)


@cli.command()
@click.argument("run_id", required=False)
@click.option("--diff", nargs=2, default=None, metavar="RUN_A RUN_B", help="where two runs diverge, step by step")
@click.option("--json", "as_json", is_flag=True)
def trace(run_id: str | None, diff: tuple[str, str] | None, as_json: bool) -> None:
    """Show each step: thought, action, arguments, observation, tokens, timings."""
    from ..core.views import run_json
    from .display import print_trace

    if diff:
        from .replay import print_diff

        print_diff(*diff, as_json=as_json)
        return
    if run_id is None:
        raise click.UsageError("give RUN_ID, or --diff RUN_A RUN_B")
    run = _load(run_id)
    steps = _runtime().store.load_steps(run_id)
    if as_json:
        out.print_json(json.dumps(run_json(run, steps)))
    else:
        print_trace(out, run, steps)


@cli.command()
@click.argument("run_id", required=False)
@click.option("--batch", "batch_id", default=None, help="cancel every unfinished run of this batch")
@click.option("--json", "as_json", is_flag=True)
def cancel(run_id: str | None, batch_id: str | None, as_json: bool) -> None:
    """Cancel a run (or with --batch, a batch); it stops at its next step."""
    from ..core.views import run_json
    from ..service.submit import cancel as cancel_run

    if batch_id is not None:
        from .retention import cancel_batch_command

        cancel_batch_command(batch_id, as_json)
        return
    if run_id is None:
        raise click.UsageError("give RUN_ID, or --batch BATCH_ID")

    _load(run_id)
    run = cancel_run(_runtime().store, run_id, _send_step())
    assert run is not None
    if as_json:
        out.print_json(json.dumps(run_json(run)))
    else:
        out.print(f"{run_id}: {run.status.value}")


@cli.command()
@click.option("--out", "outfile", default="reactq-demo-results.jsonl", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path))
def demo(outfile: Path) -> None:
    """Run the bundled evaluation set on the embedded default, starting whatever is missing."""
    from .demo import run_demo

    sys.exit(run_demo(outfile, console, out))


def _add_sandbox_commands() -> None:
    try:
        from tools_sandbox.cli import sandbox
    except ImportError:
        return
    cli.add_command(sandbox)


_add_sandbox_commands()
cli_tenants.register(cli)

from . import approvals, evaluate, replay, retention, webhooks  # noqa: E402,F401  (their verbs)


def main() -> None:
    get_settings()
    cli()


if __name__ == "__main__":
    main()
