"""The stub reasons over observations (pure): action n+1 is built from observation n, a failed call is
corrected, Chinese questions are understood; both protocols, with reactq's real tools and text parser."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from api_stub.brain import DONT_KNOW, Reply, respond
from api_stub.chains import Chain, extract, next_step, parse_chain
from api_stub.planner import plan
from tests.test_stub_brain import ALL, SYSTEM, TOOLS
from worker.core.parser import parse_text
from worker.errors import ToolError
from worker.evals.scoring import matches
from worker.tools.calculator import evaluate, format_number
from worker.tools.search import bundled_corpus, format_results

ROOT = Path(__file__).resolve().parents[1]
TODAY = dt.date(2024, 10, 7)


def real_tool(name: str, args: dict[str, str]) -> str:
    """reactq's own calculator and offline search; a tool error reads as the engine writes it."""
    try:
        if name == "search":
            return format_results(args["query"], bundled_corpus().search(args["query"]))
        return format_number(evaluate(args["expression"]))
    except ToolError as exc:
        return f"Error: {exc}"


def run_tools(question: str, system: str = "You are helpful.", limit: int = 10,
              tool=real_tool) -> tuple[str, list[tuple[str, str, str]]]:  # noqa: ANN001
    """(final answer, [(tool, argument, observation)]) of a tools-mode run."""
    messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    calls = []
    for _ in range(limit):
        reply = respond(messages, TOOLS, today=TODAY)
        if not reply.tool_calls:
            return reply.content or "", calls
        messages.append({"role": "assistant", "content": reply.content,
                         "tool_calls": [c.to_openai() for c in reply.tool_calls]})
        for call in reply.tool_calls:
            args = json.loads(call.arguments)
            observation = tool(call.name, args)
            calls.append((call.name, next(iter(args.values())), observation))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})
    raise AssertionError("no final answer")


def run_text(question: str, limit: int = 10, tool=real_tool) -> tuple[str, list[tuple[str, str, str]]]:  # noqa: ANN001
    """The same in the Thought/Action/Action Input protocol, each reply read by reactq's own parser."""
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question: {question}"}]
    calls = []
    for _ in range(limit):
        reply = respond(messages, None, today=TODAY)
        parsed = parse_text(reply.content)
        if parsed.final_answer is not None:
            return parsed.final_answer, calls
        assert parsed.error_kind is None and len(parsed.calls) == 1, reply.content
        call = parsed.calls[0]
        args = call.arguments if isinstance(call.arguments, dict) else json.loads(call.arguments)
        observation = tool(call.name, args)
        calls.append((call.name, next(iter(args.values())), observation))
        messages += [{"role": "assistant", "content": reply.content},
                     {"role": "user", "content": f"Observation: {observation}"}]
    raise AssertionError("no final answer")


RUNNERS = {"tools": run_tools, "text": run_text}


# --- multi-hop: each action from the previous observation ------------------------------------------

@pytest.mark.parametrize("mode", ["tools", "text"])
def test_oscar_director_age_takes_four_dependent_calls(mode: str) -> None:
    question = "How old was the director of the 2021 Best Picture winner in 2024?"
    answer, calls = RUNNERS[mode](question)
    assert [(t, a) for t, a, _ in calls] == [("search", "2021 Oscars Best Picture winner"),
                                             ("search", "Nomadland director"),
                                             ("search", "Chloé Zhao birth year"),
                                             ("calculator", "2024 - 1982")]
    for (_, _, observation), (_, argument, _) in zip(calls, calls[1:], strict=False):
        entity = argument.replace(" director", "").replace(" birth year", "").split(" - ")[-1]
        assert entity in observation and entity not in question  # taken from the observation
    assert "42 years old" in answer and "Chloé Zhao" in answer


@pytest.mark.parametrize("mode", ["tools", "text"])
def test_musk_mother_in_chinese(mode: str) -> None:
    answer, calls = RUNNERS[mode]("特斯拉CEO马斯克的妈妈是谁？她到2024年多大年纪？")
    assert [a for _, a, _ in calls] == ["特斯拉 CEO", "埃隆·马斯克的母亲", "梅耶·马斯克出生年份", "2024 - 1948"]
    assert answer == ("特斯拉的CEO是埃隆·马斯克，埃隆·马斯克的母亲是梅耶·马斯克，"
                      "梅耶·马斯克出生于1948年，到2024年是76岁。")


def test_the_next_query_follows_whatever_the_observation_said() -> None:
    chain = parse_chain("How old was the director of Nomadland in 2024?", 2024)
    assert chain == Chain("en", "Nomadland", ("director", "birth_year"), 2024)
    step = next_step(chain, ["1. Nomadland: The film was directed by Jane Doe and shot in Nevada."])
    assert (step.tool, step.argument) == ("search", "Jane Doe birth year")
    assert "Jane Doe" in step.thought
    step = next_step(chain, ["1. Nomadland: directed by Jane Doe.", "1. Jane Doe: Jane Doe was born in 1970."])
    assert (step.tool, step.argument) == ("calculator", "2024 - 1970")
    step = next_step(chain, ["1. Nomadland: directed by Jane Doe.", "1. Jane Doe: born in 1970.", "54"])
    assert step.tool is None and "Jane Doe is 54 years old" in step.argument


def test_a_birth_year_is_the_entitys_own() -> None:
    observation = ("1. Elon Musk: Elon Musk was born in 1971. His mother is Maye Musk.\n"
                   "2. Maye Musk: Maye Musk is a model, born on 19 April 1948.")
    assert extract("birth_year", observation, "Maye Musk") == "1948"
    assert extract("mother", observation, "Elon Musk") == "Maye Musk"
    assert extract("director", "1. 无依之地: 《无依之地》的导演是赵婷。", "无依之地", "zh") == "赵婷"
    assert extract("birth_year", "Error: Network timeout", "x") is None


def test_an_error_or_useless_observation_gets_a_rephrased_query_then_an_honest_end() -> None:
    chain = parse_chain("How old was the director of Nomadland in 2024?", 2024)
    step = next_step(chain, ["Error: Network timeout"])
    assert (step.tool, step.argument) == ("search", "Nomadland film director") and "rephrase" in step.thought
    step = next_step(chain, ["Error: Network timeout", "No results for 'Nomadland film director'."])
    assert step.tool is None and "could not find the director of Nomadland" in step.argument


@pytest.mark.parametrize("mode", ["tools", "text"])
def test_a_search_timeout_is_retried_with_other_words(mode: str) -> None:
    failed: list[str] = []

    def flaky(name: str, args: dict[str, str]) -> str:
        if name == "search" and args["query"] == "Nomadland director" and not failed:
            failed.append(args["query"])
            return "Error: Network timeout"
        return real_tool(name, args)

    answer, calls = RUNNERS[mode]("How old was the director of Nomadland in 2024?", tool=flaky)
    assert [a for _, a, _ in calls] == ["Nomadland director", "Nomadland film director", "Chloé Zhao birth year",
                                        "2024 - 1982"]
    assert "42 years old" in answer


def test_this_year_is_the_prompts_date_else_the_given_date() -> None:
    question = "How old is the director of Nomadland this year?"
    _, calls = run_tools(question, system="You are helpful. Today's date is 2030-05-01 (UTC).")
    assert calls[-1][:2] == ("calculator", "2030 - 1982")
    _, calls = run_tools(question)
    assert calls[-1][:2] == ("calculator", "2024 - 1982")  # TODAY: no date in the prompt
    assert parse_chain(question, 2031).age_at == 2031  # noqa: PLR2004


def test_weather_comparison_computes_from_both_observations() -> None:
    answer, calls = run_text("北京和上海的年平均气温相差多少摄氏度？")
    assert [a for _, a, _ in calls] == ["北京年平均气温", "上海年平均气温", "17.1 - 12.9"]
    assert "上海比北京高4.2摄氏度" in answer


# --- recovery from a tool error ------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["tools", "text"])
def test_a_calculator_syntax_error_is_fixed_and_called_again(mode: str) -> None:
    answer, calls = RUNNERS[mode]("What is 3 × (4 + 5)²?")
    assert [a for _, a, _ in calls] == ["3 × (4 + 5)²", "3 * (4 + 5) ** 2"]
    assert calls[0][2].startswith("Error: ") and calls[1][2] == "243"
    assert answer == "243"


def test_the_fix_is_said_in_the_thought() -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Question: What is √144 + 2³?"}]
    first = respond(messages)
    messages += [{"role": "assistant", "content": first.content},
                 {"role": "user", "content": "Observation: Error: cannot parse '√144 + 2³' as arithmetic"}]
    second = parse_text(respond(messages).content)
    assert second.calls[0].arguments == {"expression": "sqrt(144) + 2 ** 3"}
    assert "could not read" in (second.thought or "")


def test_a_fixed_call_that_fails_again_ends_honestly() -> None:
    answer, calls = run_tools("What is 3 × (4 + 5)²?", tool=lambda n, a: "Error: calculator is down")
    assert len(calls) == 2 and "could not compute" in answer


def test_final_only_answers_from_what_was_gathered() -> None:
    messages = [{"role": "user", "content": "How old was the director of Nomadland in 2024?"}]
    first = respond(messages, TOOLS)
    messages += [{"role": "assistant", "content": None, "tool_calls": [c.to_openai() for c in first.tool_calls]},
                 {"role": "tool", "tool_call_id": first.tool_calls[0].id,
                  "content": real_tool("search", {"query": "Nomadland director"})}]
    reply = respond(messages, TOOLS, final_only=True)
    assert not reply.tool_calls and "Chloé Zhao" in (reply.content or "")
    text = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Question: What is 2+2?"},
            {"role": "assistant", "content": 'Thought: x\nAction: search\nAction Input: {"query": "2+2"}'},
            {"role": "user",
             "content": "Observation: No results.\nYou have no steps left: give your Final Answer now."}]
    assert "Final Answer:" in (respond(text).content or "")


# --- Chinese questions -------------------------------------------------------------------------------

ARTICLE_QUESTIONS = {
    "2024年北京的GDP是多少？": "49843.1亿元",
    "半径为5的圆的面积是多少？": "78.54",
    "2024年中国的GDP增长率是多少？": "增长率为5.0%",
    "一个球体的半径是3米，它的体积是多少立方米？保留两位小数": "113.10",
    "找出 2021 年奥斯卡最佳影片的导演的出生年份，并计算他出生年份到 2024 年的年龄。": "42岁",
}


@pytest.mark.parametrize("mode", ["tools", "text"])
@pytest.mark.parametrize("question", list(ARTICLE_QUESTIONS))
def test_the_articles_chinese_questions_get_right_answers(question: str, mode: str) -> None:
    answer, calls = RUNNERS[mode](question)
    assert answer != DONT_KNOW and ARTICLE_QUESTIONS[question] in answer and calls


def test_chinese_plans() -> None:
    assert [(a.tool, a.argument) for a in plan("半径为5的圆的面积是多少？", ALL)] == [("calculator", "pi * 5 ** 2")]
    assert [(a.tool, a.argument) for a in plan("2024年北京的GDP是多少？", ALL)] == [("search", "2024年北京GDP")]
    assert [a.tool for a in plan("一个球体的半径是3米，它的体积是多少立方米？保留两位小数", ALL)] == ["calculator"]
    assert [(a.tool, a.argument) for a in plan("12乘以12等于多少？", ALL)] == [("calculator", "12 * 12")]
    assert plan("中国的首都是哪里？", frozenset({"calculator"})) == []


def test_chinese_text_reply_keeps_its_characters() -> None:
    reply = respond([{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": "Question: 北京的气候怎么样？"}])
    assert isinstance(reply, Reply) and 'Action Input: {"query": "北京气候"}' in (reply.content or "")


# --- the bundled eval set's new lines ----------------------------------------------------------------

EVAL = [json.loads(t) for t in (ROOT / "worker/data/eval_set.jsonl").read_text().splitlines() if t.strip()]
NEW = [item for item in EVAL if item.get("category") in {"dependent", "chinese", "recovery"}]


def test_the_eval_set_has_dependent_chinese_and_recovery_lines() -> None:
    categories = [item["category"] for item in NEW]
    assert categories.count("dependent") >= 3 and categories.count("chinese") >= 5
    assert categories.count("recovery") >= 2


@pytest.mark.parametrize("mode", ["tools", "text"])
@pytest.mark.parametrize("item", NEW, ids=[i["id"] for i in NEW])
def test_eval_lines_score_with_reactqs_tools(item: dict, mode: str) -> None:
    answer, calls = RUNNERS[mode](item["question"])
    assert matches(answer, item["expected"], item["match"]), answer
    chain = parse_chain(item["question"], TODAY.year)
    if item["category"] == "dependent" or chain is not None:
        assert len(calls) >= 3  # noqa: PLR2004 - three dependent steps at least
    if item["category"] == "recovery":
        assert calls[0][2].startswith("Error: ") and not calls[-1][2].startswith("Error: ")


@pytest.mark.parametrize("text_mode", [False, True])
@pytest.mark.parametrize(("question", "answer"), [("Say hello in French.", "Bonjour"), ("一周有几天？", "7"),
                                                  ("Hello!", "Hello")])
def test_common_knowledge_is_answered_without_a_tool(question: str, answer: str, text_mode: bool) -> None:
    tools = None if text_mode else TOOLS
    reply = respond([{"role": "system", "content": "Tools: calculator, search"}, {"role": "user", "content": question}],
                    tools)
    assert not reply.tool_calls and answer in reply.content and "Action:" not in reply.content


def test_a_question_the_stub_does_not_know_still_plans_a_tool() -> None:
    reply = respond([{"role": "user", "content": "What is the capital of France?"}], TOOLS)
    assert [c.name for c in reply.tool_calls] == ["search"]
