"""The pure engine's limits and bookkeeping: precheck, after_step, truncation of observations, call ids,
pricing, loop control (repeated thoughts, no-progress steps); the step decision itself is tests/test_engine.py."""

from __future__ import annotations

import random

import pytest

from tests.test_engine import LIMITS, run_
from worker.core.engine import (
    TRUNCATION_MARKER,
    Act,
    End,
    Limits,
    Progress,
    after_step,
    check_progress,
    decide,
    finish_observation,
    precheck,
    repeated_thought,
    truncate,
    unique_call_ids,
)
from worker.core.models import Observation, RunStatus, Step, ToolCall, Usage
from worker.core.parser import ParsedTurn
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


# --- loop control: repeated thoughts, no-progress steps ------------------------------------------


def _thinking(*thoughts: str | None, reflection_at: int | None = None) -> list[Step]:
    return [Step(index=i, thought=t, reflection=i == reflection_at) for i, t in enumerate(thoughts)]


@pytest.mark.parametrize(("history", "thought", "count"), [
    ([], "look it up", 1),
    (["look it up"], "look it up", 2),
    (["look it up", "look it up"], "look it up", 3),
    (["other", "look it up"], "look it up", 2),  # only the steps in a row count
    (["look it up", "other"], "look it up", 1),
    (["look it up", None], "look it up", 1),  # a step without a thought breaks the run
    (["Look  it\nUP"], "look it up", 2),  # whitespace and case aside
    (["look it up"], "", 0),  # no thought, nothing to repeat
    (["look it up"], None, 0),
    (["look it up"], "   ", 0),
])
def test_repeated_thought_counts_the_steps_in_a_row(history, thought, count):
    assert repeated_thought(_thinking(*history), thought) == count


def test_a_reflection_step_does_not_break_a_run_of_thoughts():
    history = _thinking("same", "a reflection in prose", "same", reflection_at=1)
    assert repeated_thought(history, "same") == 3


class _Tools:
    """The smallest ToolLookup: every name is an idempotent inline tool taking anything."""

    class _T:
        def __init__(self, name: str) -> None:
            self.name, self.sandboxed, self.idempotent, self.cached = name, False, True, False

        def validate(self, arguments):
            from pydantic import create_model
            return create_model("A", x=(str, ""))(x=str(arguments))

    def get(self, name):
        return self._T(name)

    def names(self):
        return ["t"]

    def refusal(self, name):
        return None


def _turn(thought: str, i: int) -> ParsedTurn:
    return ParsedTurn(thought=thought, calls=[ToolCall(id=f"c{i}", name="t", arguments={"q": str(i)})])


@pytest.mark.parametrize(("earlier", "hint", "ends"), [(0, False, False), (1, False, False), (2, True, False),
                                                      (3, False, True), (7, False, True)])
def test_the_same_thought_is_hinted_then_ends_the_run(earlier, hint, ends):
    history = _thinking(*["stuck"] * earlier)
    decision = decide(run_(), history, _turn("stuck", earlier), _Tools(), LIMITS)
    if ends:
        assert isinstance(decision, End) and decision.status == RunStatus.FAILED
        assert decision.safeguard == "repeated_thought" and f"{earlier + 1} times in a row" in decision.reason
    else:
        assert isinstance(decision, Act) and (decision.hint is not None) == hint
        if hint:
            assert "same thought 3 times" in decision.hint and decision.hint.startswith("Note: ")


def test_thought_limits_are_configurable():
    limits = Limits(thought_hint_at=2, thought_fail_at=3)
    assert decide(run_(), _thinking("x"), _turn("x", 1), _Tools(), limits).hint is not None
    assert isinstance(decide(run_(), _thinking("x", "x"), _turn("x", 2), _Tools(), limits), End)


def test_different_thoughts_never_hint():
    history = _thinking("a", "b", "c", "d", "e")
    decision = decide(run_(), history, _turn("f", 5), _Tools(), LIMITS)
    assert isinstance(decision, Act) and decision.hint is None


def _obs(*contents: str) -> list[Observation]:
    return [Observation(call_id=f"c{i}", tool="t", content=c) for i, c in enumerate(contents)]


def _observed(*steps: tuple[str, ...] | None) -> list[Step]:
    """One step per entry: its observations' contents, or None for a step without any (an invalid output)."""
    return [Step(index=i, observations=_obs(*s) if s else [], error=None if s else "bad")
            for i, s in enumerate(steps)]


@pytest.mark.parametrize(("history", "now", "streak"), [
    ([], ("4",), 1),
    ([("4",)], ("4",), 2),
    ([("4",), ("4",)], ("4",), 3),
    ([("5",), ("4",)], ("4",), 2),
    ([("4",), ("5",)], ("4",), 1),
    ([("4",), None, ("4",)], ("4",), 3),  # a step without observations is skipped, not progress
    ([("4", "x")], ("4", "x"), 2),  # a step's observations compare as a whole ...
    ([("4", "x")], ("4",), 1),
    ([("x", "4")], ("4", "x"), 1),  # ... in order
    ([], (), 0),
])
def test_no_progress_counts_the_same_observations_in_a_row(history, now, streak):
    assert check_progress(_observed(*history), _obs(*now), LIMITS).streak == streak


@pytest.mark.parametrize(("earlier", "hint", "ends"), [(1, False, False), (2, True, False), (3, False, True),
                                                      (9, False, True)])
def test_no_progress_is_hinted_then_ends_the_run(earlier, hint, ends):
    progress = check_progress(_observed(*[("No results.",)] * earlier), _obs("No results."), LIMITS)
    assert (progress.hint is not None) == hint
    if hint:
        assert progress.hint.startswith("Note: ") and "last 3 steps returned the same observation" in progress.hint
    if ends:
        assert progress.end is not None and progress.end.safeguard == "no_progress"
        assert progress.end.status == RunStatus.FAILED and f"{earlier + 1} steps in a row" in progress.end.reason
    else:
        assert progress.end is None


def test_earlier_hints_do_not_hide_the_same_observation():
    """The stored observations carry the hints given then (repeat, thought, no progress): they are not
    what the tool returned, so they do not count as a difference."""
    limits = LIMITS
    plain = "No results."
    with_hints = [
        finish_observation(plain, "Note: you have called t with these same arguments 3 times. x", limits),
        plain + "\nNote: you have written this same thought 3 times in a row. y",
        plain + "\n" + check_progress(_observed((plain,), (plain,)), _obs(plain), limits).hint,
    ]
    history = [Step(index=i, observations=_obs(c)) for i, c in enumerate(with_hints)]
    assert check_progress(history, _obs(plain), limits).streak == 4


def test_a_tool_result_that_merely_mentions_a_note_still_differs():
    history = _observed(("a\nNote: something else",))
    assert check_progress(history, _obs("a\nNote: another thing"), LIMITS).streak == 1


def test_no_progress_limits_are_configurable():
    limits = Limits(no_progress_hint_at=2, no_progress_fail_at=5)
    assert check_progress(_observed(("x",)), _obs("x"), limits).hint is not None
    assert check_progress(_observed(*[("x",)] * 3), _obs("x"), limits).end is None
    assert check_progress(_observed(*[("x",)] * 4), _obs("x"), limits).end is not None
    assert Progress(0) == check_progress([], [], limits)


# --- precheck of a step after a loop stopped the run (its best-effort answer) --------------------


def test_precheck_turns_a_marked_step_back_into_its_end():
    history = [Step(index=0, error="the model repeated the same action t(x) 4 times; stopped as a loop",
                    limit="loop")]
    end = precheck(run_(current_step=1), 0, LIMITS, history)
    assert end == End(RunStatus.FAILED, history[0].error, "loop")


def test_precheck_rebuilds_the_no_progress_reason_from_the_observations():
    history = _observed(*[("x",)] * 3) + [Step(index=3, observations=_obs("x"), limit="no_progress")]
    end = precheck(run_(current_step=4), 0, LIMITS, history)
    assert end is not None and end.safeguard == "no_progress" and "4 steps in a row" in end.reason


def test_precheck_a_marked_step_comes_after_a_cancel_and_before_max_steps():
    history = [Step(index=0, error="loop", limit="loop")]
    assert precheck(run_(status=RunStatus.CANCELLED), 0, LIMITS, history).status == RunStatus.CANCELLED
    assert precheck(run_(current_step=1, max_steps=1), 0, LIMITS, history).safeguard == "loop"


def test_precheck_ignores_the_mark_once_the_best_effort_step_is_recorded():
    history = [Step(index=0, error="loop", limit="loop"), Step(index=1, best_effort=True, final_answer="a")]
    assert precheck(run_(current_step=2, max_steps=8), 0, LIMITS, history) is None
