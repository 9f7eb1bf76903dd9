"""Rendering runs and traces for people, in the terminal (rich); `core.views.run_json` is the --json form."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table

from ..core.models import Approval, Run, Step
from ..core.views import run_json


def print_status(console: Console, run: Run) -> None:
    table = Table(show_header=False, box=None)
    for key, value in run_json(run).items():
        if key == "approvals":
            for a in run.approvals:
                table.add_row("[bold]approval[/bold]", _approval_line(run, a))
        elif value is not None:
            table.add_row(f"[bold]{key}[/bold]", json.dumps(value) if isinstance(value, dict) else str(value))
    console.print(table)


def print_trace(console: Console, run: Run, steps: list[Step]) -> None:
    console.print(f"[bold]run {run.id}[/bold]  status={run.status.value}  steps={run.current_step}  "
                  f"tokens={run.usage.prompt_tokens}+{run.usage.completion_tokens}  cost=${run.cost_usd:.6f}")
    console.print(f"[bold]question:[/bold] {run.spec.question}")
    for step in steps:
        console.rule(f"step {step.index + 1}  ({step.usage.prompt_tokens}+{step.usage.completion_tokens} tokens, "
                     f"llm {step.llm_ms} ms, tools {step.tools_ms} ms)")
        if step.thought:
            console.print(f"[cyan]{'reflection' if step.reflection else 'thought'}:[/cyan] {step.thought}")
        for call in step.tool_calls:
            args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
            console.print(f"[magenta]action:[/magenta] {call.name}  [magenta]arguments:[/magenta] {args}")
        for obs in step.observations:
            label = f"[green]observation[/green] ({obs.tool}, {obs.outcome}, {obs.duration_ms} ms)"
            console.print(f"{label}: {obs.content}")
        for approval in (a for a in run.approvals if a.step == step.index):
            console.print(f"[yellow]approval:[/yellow] {_approval_line(run, approval)}")
        if step.error:
            console.print(f"[red]error:[/red] {step.error}")
        if step.final_answer is not None:
            console.print(f"[bold green]final answer:[/bold green] {step.final_answer}")
    for approval in (a for a in run.approvals if a.step >= len(steps)):
        console.print(f"[yellow]approval:[/yellow] {_approval_line(run, approval)}")
    if run.error:
        console.print(f"[red]reason:[/red] {run.error}")
    if run.answer is not None:
        console.print(f"[bold]answer:[/bold] {run.answer}")


def _approval_line(run: Run, a: Approval) -> str:
    call = f"{a.tool}({json.dumps(a.arguments)}) call {a.call_id}, step {a.step + 1}"
    if a.decision is None:
        return (f"PENDING {call} · expires {_when(a.expires_at)} · reactq approve {run.id} {a.call_id} | "
                f"reactq reject {run.id} {a.call_id} --reason ...")
    reason = f": {a.reason}" if a.reason else ""
    return f"{a.decision.value.upper()} {call} by {a.decided_by} at {_when(a.decided_at)}{reason}"


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
