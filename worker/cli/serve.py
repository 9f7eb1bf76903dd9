"""`reactq worker`, `reactq stub` and `reactq api`: the long-running services this machine can serve."""

from __future__ import annotations

import ipaddress
import json
import os
import sys

import click

from ..config import get_settings
from ..names import SANDBOX_QUEUE, STEPS_QUEUE
from .base import _runtime, console


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--queues", default="steps,sandbox", show_default=True,
              help="steps, sandbox, webhooks, or several (comma-separated); a step worker delivers webhooks "
                   "from a small worker process of its own (REACTQ_WEBHOOK_CONCURRENCY threads)")
@click.option("--concurrency", "-c", type=int, default=None,
              help="threads (default: 200 for steps, REACTQ_WEBHOOK_CONCURRENCY for webhooks, cores for sandbox)")
@click.option("--metrics-port", type=int, default=None, help="port of /metrics (0: none; default REACTQ_METRICS_PORT)")
@click.option("--processes", "-p", type=int, default=1, show_default=True,
              help="worker processes to run (one Python process is GIL-bound: use about 2 per core for steps); "
                   "process i serves /metrics on metrics-port + i")
@click.option("--loglevel", default="INFO", show_default=True)
@click.option("--parent-pid", type=int, default=None, hidden=True,
              help="the webhook worker a step worker starts: stop when that process is gone")
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker(queues: str, concurrency: int | None, metrics_port: int | None, processes: int, loglevel: str,
           parent_pid: int | None, celery_args: tuple[str, ...]) -> None:
    """A Celery worker for the reactq queues (a threads pool: LLM calls and sandbox runs are waits).

    The same worker as `celery -A worker.celery_app worker -Q ...` (worker/tasks/worker_setup.py sets it
    up: pool, concurrency, /metrics, JSON logs, the webhook worker); this verb adds the queue names, its
    node name and the Redis wait. Other options go to `celery worker` as they are (e.g. -E, --hostname
    NAME@%h), after reactq's own, so they win; they apply to this worker only, not to the webhook worker
    it starts (whose name must differ)."""
    if processes > 1:
        if celery_args:
            raise click.UsageError(f"Celery's options ({' '.join(celery_args)}) need --processes 1: run one "
                                   "`reactq worker` per process to give each its own")
        from .local_stack import supervise_workers

        port = get_settings().metrics_port if metrics_port is None else metrics_port
        sys.exit(supervise_workers(processes, queues, concurrency, port, loglevel))
    from .. import logs
    from ..names import WEBHOOKS_QUEUE
    from ..runtime.webhook_pool import exit_with_parent
    from ..tasks.worker_setup import split_webhooks

    names = {"steps": STEPS_QUEUE, "sandbox": SANDBOX_QUEUE, "webhooks": WEBHOOKS_QUEUE}
    try:
        selected = [names[q.strip()] for q in queues.split(",") if q.strip()]
    except KeyError as exc:
        message = f"unknown queue {exc.args[0]!r}; use steps, sandbox, webhooks (comma-separated)"
        raise click.BadParameter(message, param_hint="--queues") from None
    if parent_pid is not None:
        exit_with_parent(parent_pid)
    if metrics_port is not None:  # the setting the worker's worker_init reads
        os.environ["REACTQ_METRICS_PORT"] = str(metrics_port)
        get_settings.cache_clear()
    logs.setup(loglevel)
    _runtime(patient=True)
    # Webhooks never take a thread of another queue's pool: the worker hands them to a webhook worker.
    own, _ = split_webhooks(selected, get_settings().webhook_concurrency)
    from ..tasks.app import app

    app.worker_main([
        "worker", "-Q", ",".join(selected), *(["-c", str(concurrency)] if concurrency else []),
        "--loglevel", loglevel, "-n", f"reactq-{'-'.join(q.split('.')[-1] for q in own)}-{os.getpid()}@%h",
        *celery_args,
    ])


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8900, show_default=True)
@click.option("--faults", "faults_json", default="{}", help='fault injection as JSON, e.g. {"latency_ms": 200}')
@click.option("--latency-ms", type=float, default=None)
@click.option("--chunk-delay-ms", type=float, default=None, help="a slow model: the delay between streamed chunks")
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


SEPARATE_API_METRICS_PORT = 9807


def api_metrics_port(setting: int | None, host: str) -> int:
    """Where `reactq api` serves /metrics: 0 on the API's own port, else a port of its own. Unset, the API's
    own port while it listens on loopback only (as docs/DESIGN.md has it), else 9807 (Prometheus's alone)."""
    if setting is not None:
        return setting
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    return 0 if loopback else SEPARATE_API_METRICS_PORT


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--insecure-no-auth", is_flag=True,
              help="no API keys: every caller acts as the first tenant of REACTQ_TENANTS (binds 127.0.0.1 only)")
def api(host: str, port: int, insecure_no_auth: bool) -> None:
    """The HTTP API (FastAPI): runs, batches, events (/metrics: REACTQ_API_METRICS_PORT). Needs a tenant with a key."""
    import uvicorn

    from .. import logs
    from ..api.app import create_app

    logs.setup()
    rt = _runtime()
    no_auth_tenant = None
    if insecure_no_auth:
        if "*" in rt.settings.api_allowed_hosts:  # any name: a page re-pointed at 127.0.0.1 would act freely
            console.print("[red]error:[/red] --insecure-no-auth answers only named hosts: remove \"*\" from "
                          "REACTQ_API_ALLOWED_HOSTS")
            sys.exit(2)
        no_auth_tenant = rt.settings.tenants[0]
        host = "127.0.0.1"
        console.print("[yellow]warning:[/yellow] --insecure-no-auth: no API keys are checked; serving on 127.0.0.1")
    elif rt.tenants.registered_count() == 0:
        console.print("[red]error:[/red] no tenant has been set up, so no request could be authorised. Add one:\n"
                      "  reactq tenant add NAME --plan standard && reactq key create NAME\n"
                      "(or run `reactq api --insecure-no-auth` for a local, loopback-only API without keys)")
        sys.exit(2)
    metrics_port = api_metrics_port(rt.settings.api_metrics_port, host)
    app = create_app(rt, no_auth_tenant=no_auth_tenant, serve_metrics=metrics_port == 0)
    if metrics_port:  # /metrics (tenants, spend) not on the port clients reach
        from ..runtime.metrics_server import start_api_metrics_server

        start_api_metrics_server(metrics_port, rt)
    uvicorn.run(app, host=host, port=port, log_level="warning", backlog=4096)

