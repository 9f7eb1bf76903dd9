"""`reactq ask`, `reactq batch`, `reactq status`, `reactq trace` and `reactq cancel`: submit runs, inspect
them, stop them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ..core.models import MAX_INSTRUCTIONS_CHARS, Run, Step
from ..errors import AdmissionRefused, TooLarge
from .base import _load, _runtime, _send_step, _senders, console, error, out
from .collector import setting_up
from .display import literal
from .replay import print_diff
from .retention import cancel_batch_command


def _check_instructions(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and len(value) > MAX_INSTRUCTIONS_CHARS:
        raise click.BadParameter(f"{len(value)} characters; the limit is {MAX_INSTRUCTIONS_CHARS}")
    return value or None


def _read_schema(ctx: click.Context, param: click.Parameter, value: Path | None) -> dict[str, Any] | None:
    """The JSON object in the file --output-schema names (whether it is a usable schema: validate_spec)."""
    if value is None:
        return None
    try:
        schema = json.loads(value.read_bytes()[: 1 << 20])
    except (OSError, ValueError) as exc:
        raise click.BadParameter(f"{value} is not a JSON file ({type(exc).__name__})") from None
    if not isinstance(schema, dict):
        raise click.BadParameter(f"{value} holds no JSON object")
    return schema


@click.command()
@click.argument("question")
@click.option("--wait", is_flag=True, help="wait for the answer")
@click.option("--json", "as_json", is_flag=True)
@click.option("--tenant", default="default", show_default=True)
@click.option("--tier", default=None, help="default: the tenant's plan's default tier")
@click.option("--max-steps", type=int, default=None)
@click.option("--model", default=None, help="default: REACTQ_MODEL; others from REACTQ_MODELS")
@click.option("--timeout", type=float, default=600, show_default=True, help="seconds to --wait")
@click.option("--webhook-url", default=None, help="called with the run when it finishes")
@click.option("--instructions", default=None, callback=_check_instructions,
              help=f"added to the run's system prompt (at most {MAX_INSTRUCTIONS_CHARS} characters)")
@click.option("--output-schema", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              callback=_read_schema, help="a JSON Schema file: the answer must be an object it validates")
@click.option("--python-session", is_flag=True,
              help="python keeps its globals across the run's calls (without it: the plan's default)")
def ask(question: str, wait: bool, as_json: bool, tenant: str, tier: str | None, max_steps: int | None,
        model: str | None, timeout: float, webhook_url: str | None, instructions: str | None,
        output_schema: dict[str, Any] | None, python_session: bool) -> None:
    """Submit one run."""
    from ..core.models import RunSpec
    from ..core.views import run_json
    from ..errors import InvalidRequest
    from ..service.batch import BatchRunner
    from ..service.submit import submit, tenant_policy

    rt = _runtime()
    try:
        policy = tenant_policy(rt.tenants, rt.tenants.resolve(tenant))
        tier = tier or policy.plan.default_tier or "standard"
        [run] = submit(rt.store, [RunSpec(question=question, tenant=policy.tenant, tier=tier, max_steps=max_steps,
                                          model=model, webhook_url=webhook_url,
                                          instructions=instructions, output_schema=output_schema,
                                          python_session=python_session or None)],
                       rt.settings, _send_step(),
                       interactive=True, tenants=rt.tenants, budgets=rt.budgets)
    except (InvalidRequest, AdmissionRefused, TooLarge) as exc:
        error(exc)
        sys.exit(2)
    if wait:
        runner = BatchRunner(rt.store, rt.settings, _send_step(), rt.tenants, rt.budgets)
        runner.follow([run.id], lambda r: None, lambda p: None, timeout_s=timeout)
        run = rt.store.load_run(run.id) or run
    if as_json:
        out.print_json(json.dumps(run_json(run)))
    elif wait:
        out.print(literal(run.answer if run.answer is not None else f"[{run.status.value}] {run.error or ''}"))
    else:
        out.print(literal(run.id))
    if wait and run.status.value != "succeeded":
        sys.exit(1)


@click.command()
@click.argument("infile", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "outfile", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--tenant", default=None, help="default tenant for lines without one")
@click.option("--tier", default=None, help="default tier for lines without one")
@click.option("--fresh", is_flag=True, help="start over: empty --out and submit every line anew, adopting no "
              "run of an earlier invocation for the same --out (by default a rerun runs only the lines missing "
              "from --out, adopting the earlier invocation's unfinished runs and the finished ones it was "
              "interrupted before writing)")
def batch(infile: Path, outfile: Path, tenant: str | None, tier: str | None, fresh: bool) -> None:
    """Run many questions from JSONL (one tenant's); results are written to --out as they finish."""
    with setting_up():
        from .batch_progress import run_batch_file

        rt = _runtime()
    send_step, sending_together = _senders()
    sys.exit(run_batch_file(rt, infile, outfile, tenant, tier, send_step, console, send_together=sending_together,
                            fresh=fresh))


@click.command()
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


@click.command()
@click.argument("run_id", required=False)
@click.option("--diff", nargs=2, default=None, metavar="RUN_A RUN_B", help="where two runs diverge, step by step")
@click.option("--prompt", is_flag=True, help="the messages the model was sent for a step (default: the last)")
@click.option("--step", type=click.IntRange(min=1), default=None, help="with --prompt: that step's (1 = first)")
@click.option("--json", "as_json", is_flag=True)
def trace(run_id: str | None, diff: tuple[str, str] | None, prompt: bool, step: int | None, as_json: bool) -> None:
    """Show each step: thought, action, arguments, observation, tokens, timings."""
    from ..core.views import run_json
    from .display import print_trace

    if diff:
        print_diff(*diff, as_json=as_json)
        return
    if run_id is None:
        raise click.UsageError("give RUN_ID, or --diff RUN_A RUN_B")
    if step is not None and not prompt:
        raise click.UsageError("--step goes with --prompt")
    run = _load(run_id)
    steps = _runtime().store.load_steps(run_id)
    if prompt:
        print_prompt(run, steps, step, as_json)
    elif as_json:
        out.print_json(json.dumps(run_json(run, steps)))
    else:
        print_trace(out, run, steps)


def print_prompt(run: Run, steps: list[Step], step: int | None, as_json: bool) -> None:
    """The conversation sent for step `step` (1-based; default: the last recorded step, or the next turn of a
    run with none), rebuilt by the same builder the step used (worker/runtime/prompt_inputs.py)."""
    from ..runtime.prompt_inputs import turn_messages

    index = (step - 1) if step is not None else max(len(steps) - 1, 0)
    if index > len(steps):
        error(f"run {run.id} has {len(steps)} steps; --step is at most {len(steps) + 1} (the next turn)")
        sys.exit(2)
    rt = _runtime()
    messages, compacted = turn_messages(rt, run, steps[:index], rt.tools_for(run.spec.tenant).all())
    if as_json:
        out.print_json(json.dumps({"run_id": run.id, "step": index + 1, "mode": run.mode.value,
                                   "compacted_steps": compacted, "messages": messages}, ensure_ascii=False))
        return
    out.print(literal(f"run {run.id}, the prompt of step {index + 1} ({run.mode.value} mode, "
                      f"{len(messages)} messages{f', {compacted} older steps compacted' if compacted else ''})"))
    for message in messages:
        out.rule(message["role"])
        if message.get("content"):
            out.print(literal(message["content"]))
        for call in message.get("tool_calls") or []:
            out.print(literal(f"tool call {call['function']['name']} {call['function']['arguments']}"))


@click.command()
@click.argument("run_id", required=False)
@click.option("--batch", "batch_id", default=None, help="cancel every unfinished run of this batch")
@click.option("--json", "as_json", is_flag=True)
def cancel(run_id: str | None, batch_id: str | None, as_json: bool) -> None:
    """Cancel a run (or with --batch, a batch); it stops at its next step."""
    from ..core.views import run_json
    from ..service.submit import cancel as cancel_run

    if batch_id is not None:
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
        out.print(literal(f"{run_id}: {run.status.value}"))

