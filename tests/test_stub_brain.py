"""Unit tests of api_stub's pure "model": planning, answering, both protocols, odd conversations."""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import subprocess
import sys
from pathlib import Path

import pytest

from api_stub.answers import PRINTED_NOTHING, answer_part, combine
from api_stub.brain import DONT_KNOW, Reply, respond
from api_stub.faults import FaultConfig, decide, hallucinate, malform
from api_stub.planner import Action, plan
from api_stub.tokens import count_prompt_tokens, count_tokens, truncate_to_tokens
from tools_sandbox.base.models import SandboxResult
from tools_sandbox.base.render import render

ROOT = Path(__file__).resolve().parents[1]
ALL = frozenset({"calculator", "search", "python"})
TOOLS = [{"type": "function", "function": {"name": name, "description": f"the {name} tool",
                                           "parameters": {"type": "object", "properties": {arg: {"type": "string"}},
                                                          "required": [arg]}}}
         for name, arg in (("calculator", "expression"), ("search", "query"), ("python", "code"))]
SYSTEM = ("Answer the question using these tools: calculator, search, python.\nUse the format:\n"
          "Thought: ...\nAction: <tool>\nAction Input: <json>\nObservation: ...\nFinal Answer: ...")


# --- tools computed in-test ------------------------------------------------------

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_NAMES = {"sqrt": math.sqrt, "log": math.log, "exp": math.exp, "sin": math.sin, "cos": math.cos,
          "tan": math.tan, "factorial": math.factorial, "abs": abs, "round": round, "pi": math.pi, "e": math.e}


def calculator(expression: str) -> str:
    def ev(node: ast.AST):  # noqa: ANN202
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.BinOp):
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        if isinstance(node, ast.Name):
            return _NAMES[node.id]
        if isinstance(node, ast.Call):
            return ev(node.func)(*[ev(a) for a in node.args])
        raise ValueError(type(node).__name__)
    return str(ev(ast.parse(expression, mode="eval")))


CORPUS = json.loads((ROOT / "worker/tools/corpus.json").read_text())


def search(query: str) -> str:
    words = set(re.findall(r"\w+", query.lower()))
    scored = [(len(words & set(re.findall(r"\w+", (d["title"] + " " + d["text"]).lower()))), -i, d)
              for i, d in enumerate(CORPUS)]
    top = [d for s, _, d in sorted(scored, key=lambda t: t[:2], reverse=True) if s > 0][:3]
    if not top:
        return f"No results for {query!r}"
    return "\n".join(f"{i}. {d['title']}: {d['text']}" for i, d in enumerate(top, 1))


def python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    if done.returncode:
        return f"{done.stdout}exit code {done.returncode}\nstderr: {done.stderr}"
    return done.stdout


RUN = {"calculator": lambda a: calculator(a["expression"]), "search": lambda a: search(a["query"]),
       "python": lambda a: python(a["code"])}


def run_tools_mode(question: str, limit: int = 6) -> tuple[str, list[Reply]]:
    messages: list[dict] = [{"role": "system", "content": "You are helpful."},
                            {"role": "user", "content": question}]
    replies = []
    for _ in range(limit):
        reply = respond(messages, TOOLS)
        replies.append(reply)
        if not reply.tool_calls:
            return reply.content or "", replies
        messages.append({"role": "assistant", "content": reply.content,
                         "tool_calls": [c.to_openai() for c in reply.tool_calls]})
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": RUN[call.name](json.loads(call.arguments))})
    raise AssertionError("no final answer")


_ACTION = re.compile(r"Action:\s*(\w+)\s*\nAction Input:\s*(.*)", re.S)


def run_text_mode(question: str, limit: int = 6, keep_assistant: bool = True) -> tuple[str, list[Reply]]:
    messages: list[dict] = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": f"Question: {question}"}]
    replies = []
    for _ in range(limit):
        reply = respond(messages, None)
        replies.append(reply)
        content = reply.content or ""
        if "Final Answer:" in content:
            return content.split("Final Answer:", 1)[1].strip(), replies
        tool, raw = _ACTION.search(content).groups()
        if keep_assistant:
            messages.append({"role": "assistant", "content": content})
        messages.append({"role": "user", "content": "Observation: " + RUN[tool](json.loads(raw))})
    raise AssertionError("no final answer")


BATCH = [json.loads(line) for line in (ROOT / "worker/data/sample_batch.jsonl").read_text().splitlines()
         if line.strip()]


def test_sample_batch_shape() -> None:
    assert len(BATCH) >= 24
    kinds = [tuple(a.tool for a in plan(item["question"], ALL)) for item in BATCH]
    assert sum(k == ("calculator",) for k in kinds) >= 8
    assert sum(k == ("search",) for k in kinds) >= 8
    assert sum(k == ("python",) for k in kinds) >= 6
    assert sum(len(k) >= 2 for k in kinds) >= 2
    assert len({item["id"] for item in BATCH}) == len(BATCH)


@pytest.mark.parametrize("item", BATCH, ids=[i["id"] for i in BATCH])
@pytest.mark.parametrize("mode", ["tools", "text", "text-no-assistant"])
def test_sample_batch_answered_correctly(item: dict, mode: str) -> None:
    if mode == "tools":
        answer, _ = run_tools_mode(item["question"])
    else:
        answer, _ = run_text_mode(item["question"], keep_assistant=mode == "text")
    assert item["expected"].lower() in answer.lower()


def test_corpus_shape() -> None:
    assert 35 <= len(CORPUS) <= 60
    assert all(set(d) == {"title", "text"} and d["text"].split(". ")[0] for d in CORPUS)
    assert any("reactq" in d["title"] for d in CORPUS)


# --- first actions -------------------------------------------------------------

FIRST = [
    ("What is (17 + 25) * 3?", "calculator", "(17 + 25) * 3"),
    ("What is 2 to the power of 10?", "calculator", "2 ** 10"),
    ("What is the square root of 1764?", "calculator", "sqrt(1764)"),
    ("What is 15% of 240?", "calculator", "15 * 240 / 100"),
    ("Calculate 1,000 plus 250", "calculator", "1000 + 250"),
    ("What is 100 divided by 8?", "calculator", "100 / 8"),
    ("What is sqrt(2) * pi?", "calculator", "sqrt(2) * pi"),
    ("What is the capital of Australia?", "search", "capital Australia"),
    ("Who wrote Pride and Prejudice?", "search", "wrote Pride Prejudice"),
    ("What is the factorial of 20?", "python", "import math\nprint(math.factorial(20))"),
    ("Reverse the string 'reactq'", "python", "print('reactq'[::-1])"),
]


@pytest.mark.parametrize(("question", "tool", "argument"), FIRST)
def test_first_action_tools_mode(question: str, tool: str, argument: str) -> None:
    reply = respond([{"role": "user", "content": question}], TOOLS)
    assert reply.finish_reason == "tool_calls" and len(reply.tool_calls) == 1
    call = reply.tool_calls[0]
    assert call.name == tool and call.id.startswith("call_")
    assert list(json.loads(call.arguments).values()) == [argument]


@pytest.mark.parametrize(("question", "tool", "argument"), FIRST)
def test_first_action_text_mode(question: str, tool: str, argument: str) -> None:
    reply = respond([{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question: {question}"}])
    assert reply.tool_calls == () and reply.finish_reason == "stop"
    lines = (reply.content or "").splitlines()
    assert lines[0].startswith("Thought: ") and lines[1] == f"Action: {tool}"
    assert lines[2].startswith("Action Input: ") and len(lines) == 3
    assert list(json.loads(lines[2][len("Action Input: "):]).values()) == [argument]


def test_python_tasks_compute_the_right_thing() -> None:
    cases = {"What is the sum of the first 50 prime numbers?": "5117",
             "What is the 10th prime number?": "29",
             "What is the 30th Fibonacci number?": "832040",
             "How many r's are in 'strawberry'?": "3",
             "How many vowels are in 'education'?": "5",
             "Sort the numbers 5, 3, 9 in descending order": "[9, 5, 3]",
             "What is the sum of the numbers from 1 to 100?": "5050",
             "How many days between 2024-01-01 and 2024-03-01?": "60"}
    for question, expected in cases.items():
        (action,) = plan(question, ALL)
        assert action.tool == "python", question
        assert python(action.argument).strip() == expected, question


def test_argument_name_follows_the_schema() -> None:
    tools = [{"type": "function", "function": {"name": "calculator",
                                               "parameters": {"properties": {"expr": {"type": "string"}}}}}]
    reply = respond([{"role": "user", "content": "What is 2+3?"}], tools)
    assert json.loads(reply.tool_calls[0].arguments) == {"expr": "2+3"}


def test_parallel_calls_then_combined_answer() -> None:
    answer, replies = run_tools_mode("What is 12*7 and what is 9*9?")
    assert [c.name for c in replies[0].tool_calls] == ["calculator", "calculator"]
    assert len({c.id for c in replies[0].tool_calls}) == 2 and len(replies) == 2
    assert answer.index("84") < answer.index("81")
    answer, replies = run_tools_mode("What is 3+4 and what is the capital of France?")
    assert [c.name for c in replies[0].tool_calls] == ["calculator", "search"]
    assert "7" in answer and "Paris is the capital of France" in answer


def test_a_session_answer_leaves_out_the_cells_that_printed_nothing() -> None:
    """`reactq demo`'s python session: two cells define names, the third prints. The answer is what was
    printed, not the python tool's "no output" hint twice and then the output."""
    silent = render(SandboxResult(exit_code=0, stdout="", stderr="", tier="standard", backend="docker")).text
    cells = [Action("python", "prices = [3.5, 12.25, 7.0]", "cell 1"),
             Action("python", "total = sum(prices)", "cell 2"),
             Action("python", "print(f'{len(prices)} items, {total:.2f} in all')", "cell 3")]
    answers = [answer_part(cell, out) for cell, out in zip(cells, [silent, silent, "3 items, 22.75 in all\n"],
                                                          strict=True)]
    assert answers == [PRINTED_NOTHING, PRINTED_NOTHING, "3 items, 22.75 in all"]
    assert combine(cells, answers) == "3 items, 22.75 in all"
    assert combine(cells[:2], answers[:2]) == PRINTED_NOTHING  # nothing printed at all: it says so, once
    two = [Action("calculator", "2+2", "What is 2+2"), Action("calculator", "3*3", "what is 3*3")]
    assert combine([two[0], cells[0], two[1]], ["4", PRINTED_NOTHING, "9"]) == "2+2 = 4; 3*3 = 9"


def test_text_mode_does_one_action_per_turn() -> None:
    answer, replies = run_text_mode("What is 3+4 and what is the capital of France?")
    assert len(replies) == 3 and "Action: calculator" in (replies[0].content or "")
    assert "Action: search" in (replies[1].content or "")
    assert replies[2].content.startswith("Thought: I now know the final answer\nFinal Answer: ")
    assert "Paris" in answer


def test_text_mode_tools_come_from_system_message() -> None:
    only_search = [{"role": "system", "content": "You may use: search"},
                   {"role": "user", "content": "What is 2+2?"}]
    assert "Final Answer:" in (respond(only_search).content or "")
    python_only = [{"role": "system", "content": "Tools: python"}, {"role": "user", "content": "What is 2+2?"}]
    assert "Action: python" in (respond(python_only).content or "")


def test_scratchpad_inside_one_prompt_message() -> None:
    prompt = ("Question: What is 3+4 and what is the capital of France?\nThought: compute first\n"
              "Action: calculator\nAction Input: {\"expression\": \"3+4\"}\nObservation: 7\nThought:")
    reply = respond([{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}])
    assert 'Action: search\nAction Input: {"query": "capital France"}' in (reply.content or "")


def test_compaction_summary_counts_as_done() -> None:
    summary = ("Summary of earlier steps (compacted to fit the context window):\n"
               'step 1: calculator({"expression": "3+4"}) -> 7')
    messages = [{"role": "user", "content": "What is 3+4 and what is the capital of France?"},
                {"role": "user", "content": summary}]
    reply = respond(messages, TOOLS)
    assert [c.name for c in reply.tool_calls] == ["search"]


def test_rejected_text_action_is_feedback_not_a_result() -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Question: What is 2+2?"},
                {"role": "assistant", "content": 'Thought: x\nAction: calculator\nAction Input: {"expr'},
                {"role": "user", "content": "Observation: Error: could not parse Action Input as JSON"}]
    assert 'Action Input: {"expression": "2+2"}' in (respond(messages).content or "")


def test_public_api_and_no_engine_imports() -> None:
    import api_stub
    assert all(hasattr(api_stub, name) for name in api_stub.__all__)
    for path in (ROOT / "api_stub").glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in imported if m.split(".")[0] in {"worker", "tools_sandbox"}}, path


def test_answers_only_from_observation() -> None:
    messages = [{"role": "user", "content": "What is the capital of Australia?"}]
    call = respond(messages, TOOLS).tool_calls[0]
    wrong = "1. Sydney: Sydney is the capital of Australia. It has an opera house."
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.to_openai()]},
                 {"role": "tool", "tool_call_id": call.id, "content": wrong}]
    assert respond(messages, TOOLS).content == "Sydney is the capital of Australia."


def _after(question: str, observation: str, tools: list | None = TOOLS) -> Reply:
    messages = [{"role": "user", "content": question}]
    call = respond(messages, TOOLS).tool_calls[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.to_openai()]},
                 {"role": "tool", "tool_call_id": call.id, "content": observation}]
    return respond(messages, tools)


def test_error_observations_give_honest_final_answers() -> None:
    reply = _after("What is 1/0?", "Error: ZeroDivisionError: division by zero")
    assert reply.finish_reason == "stop" and "could not" in reply.content and "division by zero" in reply.content
    reply = _after("What is the 30th Fibonacci number?",
                   "exit code 1\nstderr: Traceback (most recent call last):\nNameError: name 'x' is not defined")
    assert reply.content == "I could not compute it: NameError: name 'x' is not defined"
    reply = _after("Who wrote Hamlet?", "No results for 'wrote Hamlet'")
    assert reply.finish_reason == "stop" and "could not find" in reply.content
    assert _after("What is 2+2?", "4\n…[truncated 10 chars]").content == "4"
    assert _after("What is the 30th Fibonacci number?",
                  "832040\n…[output truncated at the tier's byte cap]\n…[truncated 5 chars]").content == "832040"
    assert _after("What is 2**0.5?", "1.4142135623730951").content == "1.4142135623730951"


def test_same_call_twice_ends_the_run() -> None:
    question = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+2?"}]
    action = respond(question).content
    feedback = {"role": "user", "content": "Your reply could not be parsed."}
    loop = question + [{"role": "assistant", "content": action}, feedback] * 2
    assert "Action:" in respond(question + [{"role": "assistant", "content": "gibberish"}, feedback]).content
    # the calls were made (assistant shows the Action) but observations got lost twice
    lost = question + [{"role": "assistant", "content": action},
                       {"role": "user", "content": "Observation: "}] * 2
    assert "Final Answer:" in respond(lost).content
    assert respond(loop).content is not None


def test_unknown_questions_get_a_polite_answer() -> None:
    for question in ["Blorp the zingers", "What is your name?", "", "asdf qwer"]:
        assert respond([{"role": "user", "content": question}], TOOLS).content == DONT_KNOW
        assert respond([{"role": "user", "content": question}]).content.endswith(DONT_KNOW)


def test_deterministic() -> None:
    messages = [{"role": "user", "content": "What is 3+4 and what is the capital of France?"}]
    assert respond(messages, TOOLS) == respond(messages, TOOLS)


ODD_MESSAGES = [
    [], [{}], [{"role": "user"}], [{"role": "user", "content": None}], [{"role": 5, "content": 7}],
    [{"role": "tool", "content": "orphan"}], [{"role": "assistant", "tool_calls": "nope"}],
    [{"role": "assistant", "tool_calls": [{"function": None}, 3, {"id": "x", "function": {"arguments": "{"}}]}],
    [{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}],
    [{"role": "user", "content": "Observation: 5"}], ["not a dict", None, 3],
    [{"role": "system", "content": "Summary of earlier steps: calculator gave 7."},
     {"role": "user", "content": "What is 3+4?"}, {"role": "user", "content": "Observation: 7"}],
    [{"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "Action: calculator\nAction Input: {bad json"},
     {"role": "user", "content": "Observation: Error: bad input"}],
    [{"role": "user", "content": "What is " + "(" * 500 + "1"}],
    [{"role": "user", "content": "What is 10 to the power of 10 to the power of 10?"}],
    [{"role": "user", "content": "x" * 20000}],
]


@pytest.mark.parametrize("messages", ODD_MESSAGES)
@pytest.mark.parametrize("tools", [None, TOOLS, [{"type": "function"}], ["junk"]])
def test_odd_conversations_never_raise(messages: list, tools: list | None) -> None:
    reply = respond(messages, tools)
    assert isinstance(reply, Reply) and (reply.content or reply.tool_calls)


def test_many_random_conversations_never_raise() -> None:
    import random
    rng = random.Random(7)
    pieces = ["Observation: 4", "Question: What is 2+2?", "Action: search", "Final Answer: 3", "", "{",
              "Who wrote Hamlet?", "1. Hamlet: Hamlet is a tragedy written by William Shakespeare."]
    for _ in range(500):
        messages = [{"role": rng.choice(["user", "assistant", "system", "tool"]),
                     "content": rng.choice(pieces), "tool_call_id": rng.choice(["a", None])}
                    for _ in range(rng.randrange(6))]
        assert isinstance(respond(messages, rng.choice([None, TOOLS])), Reply)


# --- tokens and faults ------------------------------------------------------------

def test_token_counting() -> None:
    assert count_tokens("") == 0 and count_tokens(None) == 0
    assert count_tokens("Hello, world!") == 6  # Hell|o|,|worl|d|!
    assert count_tokens("a b c") == 3
    assert truncate_to_tokens("one two three", 2) == "one two"
    base = count_prompt_tokens([{"role": "user", "content": "hi"}])
    assert count_prompt_tokens([{"role": "user", "content": "hi"}], TOOLS) > base > 4


def test_fault_decisions_are_seeded() -> None:
    config = FaultConfig(error_rate_429=0.3, malformed_rate=0.3, latency_jitter_ms=100, seed=3)
    assert [decide(config, n) for n in range(50)] == [decide(config, n) for n in range(50)]
    statuses = [decide(config, n).status for n in range(400)]
    assert 60 < statuses.count(429) < 180
    assert decide(FaultConfig(fail_first_n=2, fail_status=503), 1).status == 503
    assert decide(FaultConfig(fail_first_n=2, fail_status=503), 2).status is None


def test_malform_and_hallucinate() -> None:
    tools_reply = respond([{"role": "user", "content": "What is 2+2?"}], TOOLS)
    broken = malform(tools_reply, 0)
    with pytest.raises(ValueError):
        json.loads(broken.tool_calls[0].arguments)
    text_reply = respond([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+2?"}])
    for variant in range(4):
        garbled = malform(text_reply, variant).content or ""
        assert "Final Answer" not in garbled
    fake = hallucinate(text_reply).content or ""
    assert fake.startswith(text_reply.content) and "\nObservation: " in fake and "Final Answer: 999999" in fake


def test_slow_python_task_for_long_sandbox_calls() -> None:
    from api_stub.planner import python_code

    assert python_code("Sleep for 2.5 seconds, then print ready") == "import time\ntime.sleep(2.5)\nprint('ready')"


def test_a_given_code_block_is_sent_to_python_verbatim() -> None:
    code = "import os\nprint(os.getpid(), 'and', 6 * 7)\n"
    question = f"Run this python code:\n```python\n{code}```"
    assert [(a.tool, a.argument) for a in plan(question, frozenset({"python", "calculator"}))] == [("python", code)]
    assert plan(question, frozenset({"calculator"})) == []


REFLECT = "Reflect before going on: what have you learned so far, is your approach working?"


@pytest.mark.parametrize("tools", [TOOLS, None], ids=["tools", "text"])
def test_asked_to_reflect_it_answers_in_prose_then_goes_on(tools: list | None) -> None:
    question = "What is 17 * 23 + 4?"
    first = respond([{"role": "user", "content": question}], tools)
    history: list[dict] = [{"role": "user", "content": question}]
    if tools:
        history += [{"role": "assistant", "content": first.content,
                     "tool_calls": [c.to_openai() for c in first.tool_calls]},
                    {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "395"}]
    else:
        history += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "Observation: 395"}]
    reflection = respond([*history, {"role": "user", "content": REFLECT}], tools)
    assert not reflection.tool_calls and reflection.content
    assert "Final Answer" not in reflection.content and "395" not in reflection.content
    after = respond([*history, {"role": "user", "content": REFLECT},
                     {"role": "assistant", "content": reflection.content}], tools)
    assert "395" in (after.content or "")  # the run goes on to its answer


def test_before_any_answer_a_reflect_message_is_part_of_the_question() -> None:
    reply = respond([{"role": "user", "content": "What is 2 + 3?"}, {"role": "user", "content": REFLECT}], TOOLS)
    assert [c.name for c in reply.tool_calls] == ["calculator"]


# --- a tool the stub has no rule for (an MCP server's), named by the question ----------------------

def test_a_question_that_names_a_listed_text_mode_tool_calls_it_with_the_examples_field() -> None:
    system = ("You have access to the following tools:\n\nTool: get-env\n  What it does: env\n"
              "  Example Action Input: {}\n\nTool: echo\n  What it does: Echoes back\n  Parameters:\n"
              "    - message (string, required): Message to echo\n"
              '  Example Action Input: {"message": "hello world"}\n')
    reply = respond([{"role": "system", "content": system}, {"role": "user", "content": "call echo with hi there"}])
    assert 'Action: echo\nAction Input: {"message": "hi there"}' in reply.content


def test_a_json_object_in_the_question_is_sent_whole_to_a_hyphenated_tool() -> None:
    tools = [{"type": "function", "function": {"name": "get-sum", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]
    question = 'call get-sum with {"a": 17, "b": 25}'
    [call] = respond([{"role": "user", "content": question}], tools).tool_calls
    assert (call.name, json.loads(call.arguments)) == ("get-sum", {"a": 17, "b": 25})
    answered = [{"role": "user", "content": question},
                {"role": "assistant", "content": "", "tool_calls": [call.to_openai()]},
                {"role": "tool", "tool_call_id": call.id, "content": "The sum of 17 and 25 is 42."}]
    assert respond(answered, tools).content == "The sum of 17 and 25 is 42."
