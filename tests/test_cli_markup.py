"""Stored text is printed as it is: `reactq trace`, `status`, `ask`, `cancel` and `approve` render a
question, thought, tool call, observation, answer, error or approval reason that holds rich markup
(`[/x]`, `[link=...]`, `[bold]`), emoji codes or terminal control sequences literally. The runs are made
by the real step path on a real Redis (the harness); the real CLI reads them in a subprocess, with rich
forced to render for a colour terminal (where a `[link=...]` would become an OSC-8 hyperlink)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures_cluster import Cluster
from tests.harness import Harness, call, final
from worker.core.models import Approval, ApprovalDecision, LLMReply, Run, Usage

ROOT = Path(__file__).resolve().parent.parent
OSC8 = "\x1b]8;"

HOSTILE = {
    "question": "Q [/x] [link=http://evil]q[/link] [bold]",
    "thought": "T [/x] [link=http://evil]t[/link] [bold] :thumbs_up:",
    "observation": "O [/x] [link=http://evil]o[/link] [bold]",
    "error": "E [/x] [link=http://evil]e[/link] [bold]",
    "answer": "A [/x] [link=http://evil]a[/link] [bold]",
    "reason": "R [/x] [link=http://evil]r[/link] [bold]",
    "run_error": "F [/x] [link=http://evil]f[/link] [bold]",
}
RAW_HYPERLINK = "\x1b]8;;http://evil\x1b\\raw\x1b]8;;\x1b\\"


def reactq(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTQ_")}
    env.update({"REACTQ_REDIS_URL": redis_url, "REACTQ_TENANTS": '["default", "acme"]', "FORCE_COLOR": "1",
                "COLUMNS": "400", "TERM": "xterm-256color"})
    return subprocess.run([sys.executable, "-m", "worker.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def assert_literal(result: subprocess.CompletedProcess[str], *texts: str) -> None:
    printed = result.stdout + result.stderr
    assert result.returncode == 0, printed
    assert OSC8 not in printed, printed
    plain = _without_styles(printed)
    for text in texts:
        assert text in plain, f"{text!r} not printed literally in:\n{plain}"


def _without_styles(text: str) -> str:
    """The output with SGR colour codes removed (they may split a literal's characters apart)."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.fixture
def hostile_run(harness: Harness) -> Run:
    harness.llm.script(
        LLMReply(content=HOSTILE["thought"], tool_calls=call("calculator", {"expression": "6*7"}).tool_calls,
                 usage=Usage(prompt_tokens=10, completion_tokens=5)),
        final(HOSTILE["answer"] + RAW_HYPERLINK),
    )
    run_id = harness.submit(HOSTILE["question"])
    harness.drain()
    steps = harness.steps(run_id)
    steps[0].observations[0].content = HOSTILE["observation"]
    steps[0].error = HOSTILE["error"]
    harness.store.copy_steps(run_id, steps)
    now = time.time()

    def mutate(run: Run) -> None:
        run.error = HOSTILE["run_error"]
        run.approvals.append(Approval(step=0, call_id="c1", tool="calculator", arguments={"expression": "[/x]"},
                                      requested_at=now, expires_at=now + 60, decision=ApprovalDecision.REJECTED,
                                      decided_by="cli:[bold]", decided_at=now, reason=HOSTILE["reason"]))

    harness.store.update_run(run_id, mutate)
    return harness.run(run_id)


def test_trace_prints_every_stored_text_literally(hostile_run: Run, redis_url: str) -> None:
    result = reactq(redis_url, "trace", hostile_run.id)
    assert_literal(result, *HOSTILE.values(), '"expression": "[/x]"', "by cli:[bold]", "\\x1b]8;;http://evil")
    assert "👍" not in result.stdout  # an emoji code stays a code


def test_status_prints_every_stored_text_literally(hostile_run: Run, redis_url: str) -> None:
    result = reactq(redis_url, "status", hostile_run.id)
    assert_literal(result, HOSTILE["question"], HOSTILE["answer"], HOSTILE["run_error"], HOSTILE["reason"],
                   "\\x1b]8;;http://evil")


def test_an_unknown_run_id_with_markup_is_named_literally(redis_url: str) -> None:
    result = reactq(redis_url, "status", "[/x][link=http://evil]id[/link]")
    printed = _without_styles(result.stdout + result.stderr)
    assert result.returncode == 2 and OSC8 not in printed
    assert "no run '[/x][link=http://evil]id[/link]'" in printed


def test_cancel_of_a_finished_run_prints_its_id_literally(hostile_run: Run, redis_url: str) -> None:
    assert_literal(reactq(redis_url, "cancel", hostile_run.id), f"{hostile_run.id}: succeeded")


@pytest.mark.integration
def test_eval_and_ask_print_stored_text_literally(cluster: Cluster, tmp_path: Path) -> None:
    """The evaluation tables (worst questions, failures, the comparison), a rejected line's message and
    `reactq ask --wait` print ids, questions, answers and errors literally."""
    dataset = tmp_path / "set.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in [
        {"id": "[/x]", "question": "What is 2 + 2? [bold]", "expected": "4"},
        {"id": "[link=http://evil]b[/link]", "question": "What is 3 + 3? [/x]", "expected": "[/x] never"},
        {"id": "bad", "question": "What is 1 + 1?", "tier": "[/x][link=http://evil]t[/link]"},
    ]))
    cluster.start_worker(queues="steps", concurrency=4)
    env = {"FORCE_COLOR": "1", "COLUMNS": "400", "TERM": "xterm-256color"}
    first = cluster.reactq("eval", str(dataset), "--out", str(tmp_path / "a.jsonl"), **env)
    printed = _without_styles(first.stdout + first.stderr)
    assert first.returncode == 1, printed  # the rejected line
    assert OSC8 not in printed and "unknown tier '[/x][link=http://evil]t[/link]'" in printed, printed
    for text in ("[/x]", "[link=http://evil]b[/link]", "What is 2 + 2? [bold]", "What is 3 + 3? [/x]"):
        assert text in printed, f"{text!r} not printed literally in:\n{printed}"
    compared = cluster.reactq("eval", str(dataset), "--out", str(tmp_path / "b.jsonl"), "--compare",
                              str(tmp_path / "a.jsonl"), REACTQ_MAX_STEPS="1", **env)
    printed = _without_styles(compared.stdout + compared.stderr)
    assert OSC8 not in printed and "questions that changed" in printed and "[/x]" in printed, printed

    asked = cluster.reactq("ask", "What is 5 + 5? [/x] [link=http://evil]x[/link]", "--wait", **env)
    assert asked.returncode == 0 and OSC8 not in asked.stdout, asked.stdout + asked.stderr
