"""The pure engine's limits and bookkeeping: precheck, after_step, truncation of observations, call ids,
pricing (the step decision itself is tests/test_engine.py)."""

from __future__ import annotations

import random

import pytest

from tests.test_engine import LIMITS, run_
from worker.core.engine import (
    TRUNCATION_MARKER,
    End,
    Limits,
    after_step,
    finish_observation,
    precheck,
    truncate,
    unique_call_ids,
)
from worker.core.models import RunStatus, Step, ToolCall, Usage
from worker.core.pricing import cost_usd

# --- precheck ----------------------------------------------------------------------------------


def test_precheck_passes_a_fresh_run():
    assert precheck(run_(status=RunStatus.RUNNING), 100.0, LIMITS) is None


def test_precheck_cancelled_keeps_the_reason():
    assert precheck(run_(status=RunStatus.CANCELLED, error="by user"), 0, LIMITS) == End(
        RunStatus.CANCELLED, "by user"
    )
    assert precheck(run_(status=RunStatus.CANCELLED), 0, LIMITS) == End(RunStatus.CANCELLED, "cancelled")


def test_precheck_cancel_wins_over_every_limit():
    r = run_(status=RunStatus.CANCELLED, deadline_at=1.0, current_step=9, max_steps=8)
    assert precheck(r, 5.0, LIMITS).status == RunStatus.CANCELLED


@pytest.mark.parametrize(("now", "ends"), [(99.9, False), (100.0, True), (150.0, True)])
def test_precheck_deadline(now, ends):
    end = precheck(run_(deadline_at=100.0), now, LIMITS)
    if ends:
        assert end is not None and end.status == RunStatus.TIMEOUT
        assert "deadline" in end.reason
    else:
        assert end is None


def test_precheck_without_deadline_never_times_out():
    assert precheck(run_(deadline_at=None), 1e12, LIMITS) is None


@pytest.mark.parametrize(("current", "ends"), [(4, False), (5, True), (6, True)])
def test_precheck_max_steps(current, ends):
    end = precheck(run_(current_step=current, max_steps=5), 0, LIMITS)
    if ends:
        assert end is not None and end.status == RunStatus.MAX_STEPS
        assert "max_steps=5" in end.reason
    else:
        assert end is None


@pytest.mark.parametrize(("prompt", "completion", "ends"), [(60, 39, False), (60, 40, True), (200, 0, True)])
def test_precheck_token_budget(prompt, completion, ends):
    r = run_(usage=Usage(prompt_tokens=prompt, completion_tokens=completion))
    end = precheck(r, 0, Limits(max_tokens_per_run=100))
    if ends:
        assert end is not None and end.status == RunStatus.BUDGET_EXCEEDED
        assert "100" in end.reason
    else:
        assert end is None


def test_precheck_budget_zero_means_unlimited():
    r = run_(usage=Usage(prompt_tokens=10**9, completion_tokens=10**9))
    assert precheck(r, 0, Limits(max_tokens_per_run=0)) is None


# --- after_step --------------------------------------------------------------------------------


def test_after_step_final_answer_succeeds_even_on_the_last_step():
    r = run_(max_steps=3, current_step=3)
    assert after_step(r, Step(index=2, final_answer="x"), 0, LIMITS) == End(RunStatus.SUCCEEDED, "")


def test_after_step_final_answer_wins_over_deadline_and_budget():
    r = run_(deadline_at=1.0, usage=Usage(prompt_tokens=500))
    end = after_step(r, Step(index=0, final_answer="x"), 10.0, Limits(max_tokens_per_run=10))
    assert end is not None and end.status == RunStatus.SUCCEEDED


def test_after_step_continues_in_the_middle():
    assert after_step(run_(max_steps=3, current_step=2), Step(index=1), 0, LIMITS) is None


def test_after_step_max_steps_on_the_last_step():
    end = after_step(run_(max_steps=3, current_step=3), Step(index=2), 0, LIMITS)
    assert end is not None and end.status == RunStatus.MAX_STEPS
    assert "max_steps=3" in end.reason


def test_after_step_timeout():
    end = after_step(run_(deadline_at=50.0), Step(index=0), 50.0, LIMITS)
    assert end is not None and end.status == RunStatus.TIMEOUT
    assert after_step(run_(deadline_at=50.0), Step(index=0), 49.0, LIMITS) is None


def test_after_step_budget_exceeded():
    r = run_(usage=Usage(prompt_tokens=80, completion_tokens=25))
    step = Step(index=0, usage=Usage(prompt_tokens=30, completion_tokens=5))
    end = after_step(r, step, 0, Limits(max_tokens_per_run=100))
    assert end is not None and end.status == RunStatus.BUDGET_EXCEEDED
    assert "(105)" in end.reason


def test_after_step_counts_the_step_tokens_once():
    # The store adds the step's usage to the run before asking (runner._commit -> store.commit_step):
    # 60 spent in total, 40 of them by this step, is within a budget of 100.
    r = run_(usage=Usage(prompt_tokens=50, completion_tokens=10))
    step = Step(index=1, usage=Usage(prompt_tokens=30, completion_tokens=10))
    assert after_step(r, step, 0, Limits(max_tokens_per_run=100)) is None


# --- observations ------------------------------------------------------------------------------


def test_truncate_leaves_short_text_alone():
    assert truncate("abc", 3) == "abc"
    assert truncate("", 0) == ""


def test_truncate_marks_the_cut_count():
    text = "x" * 150
    out = truncate(text, 100)
    assert out == "x" * 100 + TRUNCATION_MARKER.format(n=50)
    assert out.endswith("[truncated 50 chars]")


def test_finish_observation_truncates_then_appends_the_hint():
    limits = Limits(observation_max_chars=10)
    out = finish_observation("y" * 25, "Note: stop repeating", limits)
    assert out.startswith("y" * 10 + "\n…[truncated 15 chars]")
    assert out.endswith("\nNote: stop repeating")
    assert finish_observation("short", None, limits) == "short"


# --- call ids ----------------------------------------------------------------------------------


def _ids(ids: list[str]) -> list[str]:
    return [c.id for c in unique_call_ids([ToolCall(id=i, name="t") for i in ids])]


def test_unique_ids_are_kept_as_they_are():
    calls = [ToolCall(id="a", name="t"), ToolCall(id="b", name="t")]
    out = unique_call_ids(calls)
    assert [c.id for c in out] == ["a", "b"]
    assert out[0] is calls[0]


def test_duplicate_and_missing_ids_are_made_unique():
    assert _ids(["a", "a"]) == ["a", "a-1"]
    assert _ids(["", ""]) == ["call-0", "call-1"]
    assert _ids(["", "call-0"]) == ["call-0", "call-0-1"]


def test_a_suffixed_id_never_collides_with_an_existing_one():
    out = _ids(["a", "a-2", "a"])
    assert len(set(out)) == 3
    assert out[:2] == ["a", "a-2"]


def test_unique_ids_do_not_mutate_the_input():
    calls = [ToolCall(id="a", name="t"), ToolCall(id="a", name="t")]
    unique_call_ids(calls)
    assert [c.id for c in calls] == ["a", "a"]


def test_unique_ids_fuzz():
    rng = random.Random(7)
    alphabet = ["", "a", "a-1", "a-2", "call-0", "call-1", "call-1-1", "b"]
    for _ in range(2000):
        ids = [rng.choice(alphabet) for _ in range(rng.randint(1, 7))]
        out = _ids(ids)
        assert len(out) == len(ids)
        assert len(set(out)) == len(out), ids
        assert all(out), ids
        assert out[0] == (ids[0] or "call-0")


# --- pricing -----------------------------------------------------------------------------------


def test_cost_per_million_tokens():
    prices = {"m": (2.0, 8.0)}
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=500_000)
    assert cost_usd("m", usage, prices) == pytest.approx(6.0)
    assert cost_usd("other", usage, prices) == 0.0
    assert cost_usd("m", Usage(), prices) == 0.0
