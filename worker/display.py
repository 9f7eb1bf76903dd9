"""Rendering runs and traces for people (rich) and machines (--json)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from .core.models import Run, Step


def run_json(run: Run, steps: list[Step] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        **run.result_line(),
        "question": run.spec.question,
        "tenant": run.spec.tenant,
        "tier": run.spec.tier,
        "mode": run.mode.value,
        "model": run.model,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "finished_at": run.finished_at,
        "waiting_on": run.waiting_on,
        "max_steps": run.max_steps,
    }
    if steps is not None:
        data["trace"] = [s.model_dump() for s in steps]
    return data


def print_status(console: Console, run: Run) -> None:
    table = Table(show_header=False, box=None)
    for key, value in run_json(run).items():
        if value is not None:
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
        if step.error:
            console.print(f"[red]error:[/red] {step.error}")
        if step.final_answer is not None:
            console.print(f"[bold green]final answer:[/bold green] {step.final_answer}")
    if run.error:
        console.print(f"[red]reason:[/red] {run.error}")
    if run.answer is not None:
        console.print(f"[bold]answer:[/bold] {run.answer}")
