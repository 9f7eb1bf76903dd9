"""Rendering runs and traces for people, in the terminal (rich); `core.views.run_json` is the --json form.

Every stored or user-given text (a question, a thought, an observation, an answer, an error, an id) is
printed through `literal`: a rich `Text`, never parsed as markup or emoji codes (`[/x]` cannot crash a
command, `[link=...]` cannot write a hyperlink), with terminal control characters shown as escapes (no
raw ANSI or OSC-8 sequence reaches the terminal)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..core.models import Approval, Run, Step
from ..core.views import run_json

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all but newline and tab


def literal(value: object) -> Text:
    """`value` as text printed as it is (see the module's docstring)."""
    return Text(_CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", str(value)))


def labelled(label: str, style: str, value: object) -> Text:
    """A styled label, a space, and `value` as it is."""
    return Text.assemble((label, style), " ", literal(value))


def print_status(console: Console, run: Run) -> None:
    table = Table(show_header=False, box=None)
    for key, value in run_json(run).items():
        if key == "approvals":
            for a in run.approvals:
                table.add_row(Text("approval", "bold"), literal(_approval_line(run, a)))
        elif value is not None:
            table.add_row(Text(key, "bold"), literal(json.dumps(value) if isinstance(value, dict) else value))
    console.print(table)


def print_trace(console: Console, run: Run, steps: list[Step]) -> None:
    console.print(Text.assemble((f"run {run.id}", "bold"), literal(
        f"  status={run.status.value}  steps={run.current_step}  "
        f"tokens={run.usage.prompt_tokens}+{run.usage.completion_tokens}  cost=${run.cost_usd:.6f}")))
    console.print(labelled("question:", "bold", run.spec.question))
    for step in steps:
        console.rule(f"step {step.index + 1}  ({step.usage.prompt_tokens}+{step.usage.completion_tokens} tokens, "
                     f"llm {step.llm_ms} ms, tools {step.tools_ms} ms)")
        if step.reasoning:
            tokens = f" ({step.reasoning_tokens} tokens)" if step.reasoning_tokens is not None else ""
            console.print(labelled(f"reasoning{tokens}:", "dim cyan", step.reasoning))
        if step.thought:
            console.print(labelled("reflection:" if step.reflection else "thought:", "cyan", step.thought))
        for call in step.tool_calls:
            args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments, ensure_ascii=False)
            console.print(Text.assemble(labelled("action:", "magenta", call.name), "  ",
                                        labelled("arguments:", "magenta", args)))
        for obs in step.observations:
            cells = obs.sandbox.session_cells if obs.sandbox is not None else None
            session = f", session cell {cells + 1}" if cells is not None else ""
            label = Text.assemble(("observation", "green"),
                                  literal(f" ({obs.tool}, {obs.outcome}, {obs.duration_ms} ms{session}):"))
            console.print(Text.assemble(label, " ", literal(obs.content)))
        for approval in (a for a in run.approvals if a.step == step.index):
            console.print(labelled("approval:", "yellow", _approval_line(run, approval)))
        if step.error:
            console.print(labelled("error:", "red", step.error))
        if step.final_answer is not None:
            console.print(labelled("best-effort answer (at a limit, tools disabled):" if step.best_effort
                                   else "final answer:", "bold green", step.final_answer))
    for approval in (a for a in run.approvals if a.step >= len(steps)):
        console.print(labelled("approval:", "yellow", _approval_line(run, approval)))
    if run.error:
        console.print(labelled("reason:", "red", run.error))
    if run.answer is not None:
        console.print(labelled("answer (partial):" if run.partial else "answer:", "bold", run.answer))


def _approval_line(run: Run, a: Approval) -> str:
    """Plain text (print it through `literal`)."""
    call = f"{a.tool}({json.dumps(a.arguments)}) call {a.call_id}, step {a.step + 1}"
    if a.decision is None:
        return (f"PENDING {call} · expires {_when(a.expires_at)} · reactq approve {run.id} {a.call_id} | "
                f"reactq reject {run.id} {a.call_id} --reason ...")
    reason = f": {a.reason}" if a.reason else ""
    return f"{a.decision.value.upper()} {call} by {a.decided_by} at {_when(a.decided_at)}{reason}"


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
