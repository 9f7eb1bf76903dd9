"""The pure half of the best-effort answer at a limit (worker/core/best_effort.py) and how `reactq eval`
counts partial answers apart (worker/evals)."""

from __future__ import annotations

import pytest

from worker.core import best_effort
from worker.core.engine import End, Limits
from worker.core.models import LLMReply, Mode, Run, RunSpec, RunStatus, Usage
from worker.evals.scoring import MatchMode
from worker.evals.summary import summarise
from worker.evals.table import rescored

MAX = End(RunStatus.MAX_STEPS, "reached max_steps=3 without a final answer")


@pytest.mark.parametrize(("end", "wanted"), [
    (MAX, True),
    (End(RunStatus.FAILED, "loop", "loop"), True),
    (End(RunStatus.FAILED, "bad", "invalid_outputs"), True),
    (End(RunStatus.FAILED, "thought", "repeated_thought"), True),
    (End(RunStatus.FAILED, "stuck", "no_progress"), True),
    (End(RunStatus.TIMEOUT, "run deadline passed"), False),
    (End(RunStatus.BUDGET_EXCEEDED, "spent"), False),
    (End(RunStatus.FAILED, "LLM down"), False),
    (End(RunStatus.FAILED, "sandbox_unavailable"), False),
    (End(RunStatus.CANCELLED, "cancelled"), False),
])
def test_which_ends_ask_for_a_best_effort_answer(end, wanted):
    assert best_effort.eligible(end) is wanted


def _run(**kw) -> Run:
    return Run(spec=RunSpec(question="q"), **kw)


def test_room_for_the_last_call():
    limits = Limits(max_tokens_per_run=100)
    assert best_effort.has_room(_run(deadline_at=10.0), 9.9, limits)
    assert not best_effort.has_room(_run(deadline_at=10.0), 10.0, limits)
    assert best_effort.has_room(_run(deadline_at=None), 1e12, Limits())
    assert not best_effort.has_room(_run(usage=Usage(prompt_tokens=60, completion_tokens=40)), 0, limits)
    assert best_effort.has_room(_run(usage=Usage(prompt_tokens=60, completion_tokens=39)), 0, limits)
    assert best_effort.has_room(_run(usage=Usage(prompt_tokens=10**9)), 0, Limits())  # 0: no budget


def test_tools_mode_request_keeps_the_tools_and_forbids_calling_them():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    options = {"model": "m", "tools": [{"type": "function"}]}
    sent, opts = best_effort.final_request(Mode.TOOLS, messages, options, MAX)
    assert opts == {"model": "m", "tools": [{"type": "function"}], "tool_choice": "none"}
    assert sent[:2] == messages and len(messages) == 2 and "tool_choice" not in options  # inputs untouched
    assert sent[-1]["role"] == "user"
    assert sent[-1]["content"].startswith("You have reached the step limit. Using only the observations above, "
                                          "give your best Final Answer now, even if approximate.")


def test_text_mode_request_asks_for_the_final_answer_line():
    sent, opts = best_effort.final_request(Mode.TEXT, [], {"stop": ["\nObservation:"]}, End(
        RunStatus.FAILED, "x", "loop"))
    assert opts == {"stop": ["\nObservation:"]}
    assert "repeated the same action" in sent[-1]["content"] and '"Final Answer:"' in sent[-1]["content"]


@pytest.mark.parametrize(("mode", "content", "answer"), [
    (Mode.TEXT, "Thought: I have it.\nFinal Answer: 42", "42"),
    (Mode.TEXT, "思考: 有了\n最终答案: 四十二", "四十二"),
    (Mode.TEXT, "Thought: hmm\nAction: search\nAction Input: x\nProbably 42.", "Probably 42."),
    (Mode.TEXT, "Probably 42.", "Probably 42."),
    (Mode.TEXT, "Thought: only thinking", None),
    (Mode.TEXT, "", None),
    (Mode.TEXT, None, None),
    (Mode.TOOLS, "About 42.", "About 42."),
    (Mode.TOOLS, "Final Answer: 42", "42"),
    (Mode.TOOLS, "  \n", None),
    (Mode.TOOLS, None, None),
])
def test_the_answer_in_the_reply(mode, content, answer):
    assert best_effort.answer_from(mode, LLMReply(content=content)) == answer


def test_a_tool_call_despite_tool_choice_none_is_ignored():
    from worker.core.models import ToolCall

    reply = LLMReply(content="I think 42.", tool_calls=[ToolCall(id="c", name="search", arguments={})])
    assert best_effort.answer_from(Mode.TOOLS, reply) == "I think 42."


# --- reactq eval -------------------------------------------------------------------------------


def _line(i: str, status: str, answer: str | None, partial: bool = False) -> dict:
    return {"id": i, "status": status, "answer": answer, "partial": partial, "steps": 3,
            "usage": {"prompt_tokens": 1, "completion_tokens": 1}, "cost_usd": 0.0, "error": None}


def test_a_partial_answer_is_never_correct_but_its_match_is_told_apart():
    exp = ("42", MatchMode.CONTAINS)
    right = rescored(_line("a", "max_steps", "about 42", partial=True), exp)
    wrong = rescored(_line("b", "max_steps", "about 7", partial=True), exp)
    assert (right["correct"], right["partial_correct"]) == (False, True)
    assert (wrong["correct"], wrong["partial_correct"]) == (False, False)
    assert "partial_correct" not in rescored(_line("c", "succeeded", "42"), exp)


def test_the_summary_counts_partial_answers_apart():
    exp = ("42", MatchMode.CONTAINS)
    lines = [rescored(x, exp) for x in (
        _line("a", "succeeded", "42"),
        _line("b", "max_steps", "42 or so", partial=True),
        _line("c", "failed", "no idea", partial=True),
        _line("d", "max_steps", None),
    )]
    s = summarise(lines)
    assert (s.questions, s.correct, s.partial, s.partial_correct) == (4, 1, 2, 1)
    assert s.to_json()["partial"] == 2
    assert {(f.status, f.count) for f in s.failures} == {("max_steps", 2), ("failed", 1)}
