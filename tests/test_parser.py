"""The ReAct output parser against what real models write, plus a seeded fuzz run."""

from __future__ import annotations

import random

import pytest

import worker.core.parser as parser_module
from worker.core.models import ToolCall
from worker.core.parser import (
    PARSE_ERROR_KINDS,
    PARSE_WARNINGS,
    TEXT_STOP_SEQUENCES,
    FormatExample,
    ParsedTurn,
    parse_text,
    parse_tool_reply,
)

PSI = "plain_string_input"


def case(name, text, *, thought=None, call=None, final=None, error=None, warnings=()):
    """One table row: `call` is (tool name, arguments); `error` is the expected error kind."""
    return pytest.param(text, thought, call, final, error, sorted(warnings), id=name)


TEXT_CASES = [
    # --- the standard format (GPT-style)
    case("standard", 'Thought: I need to look this up.\nAction: search\nAction Input: {"query": "x"}',
         thought="I need to look this up.", call=("search", {"query": "x"})),
    case("json-string-input", 'Thought: t\nAction: search\nAction Input: "capital of France"',
         thought="t", call=("search", "capital of France"), warnings=[PSI]),
    case("plain-text-input", "Thought: t\nAction: search\nAction Input: capital of France",
         thought="t", call=("search", "capital of France"), warnings=[PSI]),
    case("single-quoted-plain-input", "Thought: t\nAction: search\nAction Input: 'Paris'",
         thought="t", call=("search", "Paris"), warnings=[PSI]),
    case("backticked-input", "Thought: t\nAction: calculator\nAction Input: `2 + 2`",
         thought="t", call=("calculator", "2 + 2"), warnings=[PSI]),
    case("number-input-kept-as-text", "Thought: t\nAction: calculator\nAction Input: 42",
         thought="t", call=("calculator", "42"), warnings=[PSI]),
    case("list-input-kept-as-text", 'Thought: t\nAction: search\nAction Input: ["a", "b"]',
         thought="t", call=("search", '["a", "b"]'), warnings=[PSI]),
    case("multiline-json", 'Thought: t\nAction: search\nAction Input: {\n  "query": "x",\n  "k": 3\n}',
         thought="t", call=("search", {"query": "x", "k": 3})),
    case("json-on-next-line", 'Thought: t\nAction: search\nAction Input:\n{"query": "x"}',
         thought="t", call=("search", {"query": "x"})),
    case("nested-json", 'Thought: t\nAction: api\nAction Input: {"a": {"b": [1, {"c": null}]}, "d": true}',
         thought="t", call=("api", {"a": {"b": [1, {"c": None}]}, "d": True})),
    case("code-fenced-json", 'Thought: t\nAction: search\nAction Input:\n```json\n{"query": "x"}\n```',
         thought="t", call=("search", {"query": "x"})),
    case("code-fenced-no-lang", 'Thought: t\nAction: search\nAction Input: ```\n{"query": "x"}\n```',
         thought="t", call=("search", {"query": "x"})),
    case("code-fenced-one-line", 'Thought: t\nAction: search\nAction Input: ```json {"query": "x"}```',
         thought="t", call=("search", {"query": "x"})),
    case("python-code-fence", "Thought: t\nAction: python\nAction Input:\n```python\nprint(1)\nx = {}\n```",
         thought="t", call=("python", "print(1)\nx = {}"), warnings=[PSI]),
    case("fence-with-trailing-text", 'Action: search\nAction Input: ```json\n{"query": "x"}\n```\nDone.',
         call=("search", {"query": "x"}), warnings=["trailing_text"]),
    case("trailing-text-after-json", 'Thought: t\nAction: search\nAction Input: {"query": "x"} I will wait.',
         thought="t", call=("search", {"query": "x"}), warnings=["trailing_text"]),
    case("literal-newline-in-json-string", 'Action: python\nAction Input: {"code": "a = 1\nprint(a)"}',
         call=("python", {"code": "a = 1\nprint(a)"})),
    case("single-quoted-json-dict", "Thought: t\nAction: search\nAction Input: {'query': 'x', 'k': True}",
         thought="t", call=("search", {"query": "x", "k": True}), warnings=["python_literal_input"]),
    case("broken-json-object", 'Thought: t\nAction: search\nAction Input: {"query": "x",',
         thought="t", error="invalid_action_input"),
    case("unquoted-keys", "Thought: t\nAction: search\nAction Input: {query: x}",
         thought="t", error="invalid_action_input"),
    case("empty-object", "Thought: t\nAction: get_time\nAction Input: {}",
         thought="t", call=("get_time", {})),
    case("empty-action-input-is-empty-object", "Thought: t\nAction: get_time\nAction Input:",
         thought="t", call=("get_time", {})),
    case("unicode", 'Thought: 東京について調べる\nAction: search\nAction Input: {"query": "東京 🗼"}',
         thought="東京について調べる", call=("search", {"query": "東京 🗼"})),
    case("windows-line-endings", 'Thought: t\r\nAction: search\r\nAction Input: {"query": "x"}\r\n',
         thought="t", call=("search", {"query": "x"})),
    case("old-mac-line-endings", "Thought: t\rFinal Answer: 42", thought="t", final="42"),
    case("bom", "\ufeffThought: t\nFinal Answer: 42", thought="t", final="42"),
    case("multi-line-thought", 'Thought: first\nsecond\nAction: search\nAction Input: {"query": "x"}',
         thought="first\nsecond", call=("search", {"query": "x"})),
    # --- label variants
    case("case-insensitive", 'THOUGHT: t\naction: search\nACTION INPUT: {"query": "x"}',
         thought="t", call=("search", {"query": "x"})),
    case("extra-spaces", '  Thought :  t  \nAction  :   search  \nAction   Input :  {"query": "x"}',
         thought="t", call=("search", {"query": "x"})),
    case("underscore-labels", 'Thought: t\nAction: search\nAction_Input: {"query": "x"}',
         thought="t", call=("search", {"query": "x"})),
    case("thoughts-plural", "Thoughts: t\nFinal Answer: 1", thought="t", final="1"),
    case("markdown-bold", '**Thought:** t\n**Action:** search\n**Action Input:** {"query": "x"}',
         thought="t", call=("search", {"query": "x"})),
    case("markdown-bold-label-only", '**Thought**: t\n**Action**: `search`\n**Action Input**: {"query": "x"}',
         thought="t", call=("search", {"query": "x"})),
    case("markdown-bold-whole-line", "**Thought: t**\n**Final Answer: Paris**", thought="t", final="Paris"),
    case("markdown-list-and-heading", '- Thought: t\n- Action: search\n- Action Input: {"query": "x"}',
         thought="t", call=("search", {"query": "x"})),
    case("heading-final", "Thought: done\n### Final Answer: 42", thought="done", final="42"),
    case("full-width-colon", 'Thought： t\nAction： search\nAction Input： {"query": "x"}',
         thought="t", call=("search", {"query": "x"})),
    case("quoted-action-name", 'Thought: t\nAction: "search"\nAction Input: {"query": "x"}',
         thought="t", call=("search", {"query": "x"})),
    case("action-name-with-parens", 'Action: search()\nAction Input: {"query": "x"}',
         call=("search", {"query": "x"})),
    case("action-name-trailing-period", 'Action: search.\nAction Input: {"query": "x"}',
         call=("search", {"query": "x"})),
    # --- numbered labels and the ReAct-paper bracket form
    case("numbered", 'Thought 1: t\nAction 1: search\nAction Input 1: {"query": "x"}',
         thought="t", call=("search", {"query": "x"}), warnings=["numbered_labels"]),
    case("paper-bracket", "Thought 1: I need to search Colorado orogeny.\nAction 1: Search[Colorado orogeny]",
         thought="I need to search Colorado orogeny.", call=("Search", "Colorado orogeny"),
         warnings=["numbered_labels", "bracket_action"]),
    case("paper-lookup", "Thought 2: find it\nAction 2: Lookup[eastern sector]",
         thought="find it", call=("Lookup", "eastern sector"),
         warnings=["numbered_labels", "bracket_action"]),
    case("paper-finish",
         "Thought 3: So the answer is 1,800 to 7,000 ft.\nAction 3: Finish[1,800 to 7,000 ft]",
         thought="So the answer is 1,800 to 7,000 ft.", final="1,800 to 7,000 ft",
         warnings=["numbered_labels", "bracket_action"]),
    case("paper-act-obs-short-forms", "Thought 1: t\nAct 1: Search[x]\nObs 1: x is y\nThought 2: done",
         thought="t", call=("Search", "x"),
         warnings=["numbered_labels", "bracket_action", "hallucinated_observation"]),
    case("paper-finish-empty", "Action: Finish[]", error="empty_final_answer", warnings=["bracket_action"]),
    case("bracket-ignores-action-input", "Action: Search[x]\nAction Input: y",
         call=("Search", "x"), warnings=["bracket_action"]),
    # --- Chinese (Qwen-style)
    case("chinese-full-width", '思考：我需要搜索北京的人口\n行动：search\n行动输入：{"query": "北京 人口"}',
         thought="我需要搜索北京的人口", call=("search", {"query": "北京 人口"})),
    case("chinese-ascii-colon", "思考: 我知道了\n最终答案: 北京有2100万人",
         thought="我知道了", final="北京有2100万人"),
    case("chinese-hallucinated-observation",
         '思考：查一下\n行动：search\n行动输入：{"q": 1}\n观察：结果\n最终答案：x',
         thought="查一下", call=("search", {"q": 1}), warnings=["hallucinated_observation"]),
    # --- hallucinated observations
    case("hallucinated-observation",
         'Thought: t\nAction: search\nAction Input: {"query": "x"}\nObservation: Paris',
         thought="t", call=("search", {"query": "x"}), warnings=["hallucinated_observation"]),
    case("hallucinated-chain",
         'Thought: t\nAction: search\nAction Input: {"query": "x"}\nObservation: Paris\n'
         "Thought: I now know the final answer\nFinal Answer: Paris",
         thought="t", call=("search", {"query": "x"}), warnings=["hallucinated_observation"]),
    case("numbered-hallucinated-chain", "Thought 1: t\nAction 1: Search[x]\nObservation 1: y\n"
         "Thought 2: u\nAction 2: Finish[y]",
         thought="t", call=("Search", "x"),
         warnings=["numbered_labels", "bracket_action", "hallucinated_observation"]),
    case("observation-before-any-action-ignored",
         "Observation: I see nothing yet.\nThought: t\nFinal Answer: 1",
         thought="t", final="1"),
    # --- action and final answer together
    case("action-then-final", 'Thought: t\nAction: search\nAction Input: {"query": "x"}\nFinal Answer: Paris',
         thought="t", call=("search", {"query": "x"}), warnings=["action_and_final_answer"]),
    case("final-then-action", 'Thought: t\nFinal Answer: Paris\nAction: search\nAction Input: {"query": "x"}',
         thought="t", final="Paris", warnings=["action_and_final_answer"]),
    case("repeated-action-first-wins", 'Thought: t\nAction: search\nAction Input: {"query": "a"}\n'
         'Thought: u\nAction: search\nAction Input: {"query": "b"}',
         thought="t", call=("search", {"query": "a"}), warnings=["multiple_actions"]),
    case("input-of-second-action-not-borrowed", 'Action: first\nAction: second\nAction Input: {"a": 1}',
         error="missing_action_input", warnings=["multiple_actions"]),
    # --- final answers
    case("final-only", "Final Answer: 42", final="42"),
    case("final-multi-line", "Thought: done\nFinal Answer: Line one.\n\nLine two:\n- a\n- b\n",
         thought="done", final="Line one.\n\nLine two:\n- a\n- b"),
    case("final-answer-on-next-line", "Thought: done\nFinal Answer:\nParis", thought="done", final="Paris"),
    case("final-empty", "Thought: done\nFinal Answer:   ", thought="done", error="empty_final_answer"),
    case("final-then-thought-label-ends-it", "Final Answer: 42\nThought: that was easy", final="42"),
    # --- chatter, Llama-style, LangChain-style
    case("leading-chatter-before-thought",
         'Sure! Let me help.\nThought: t\nAction: search\nAction Input: {"q": 1}',
         thought="t", call=("search", {"q": 1})),
    case("llama-no-thought-label", 'I should search for this.\nAction: search\nAction Input: {"query": "x"}',
         thought="I should search for this.", call=("search", {"query": "x"})),
    case("langchain-json-action",
         'Thought: t\nAction:\n```json\n{"action": "search", "action_input": "x"}\n```',
         thought="t", call=("search", "x"), warnings=["json_action", PSI]),
    case("langchain-json-final", 'Action: {"action": "Final Answer", "action_input": "Paris"}',
         final="Paris", warnings=["json_action"]),
    case("unlabelled-input-same-line", 'Thought: t\nAction: search {"query": "x"}',
         thought="t", call=("search", {"query": "x"}), warnings=["unlabelled_action_input"]),
    case("unlabelled-input-next-line", 'Thought: t\nAction: search\n{"query": "x"}',
         thought="t", call=("search", {"query": "x"}), warnings=["unlabelled_action_input"]),
    case("unlabelled-fenced-code", "Thought: run it\nAction: python\n```python\nprint(1)\n```",
         thought="run it", call=("python", "print(1)"), warnings=["unlabelled_action_input", PSI]),
    case("chatter-before-final-is-thought", "Easy one.\nFinal Answer: 4", thought="Easy one.", final="4"),
    # --- the seed articles' formats (docs/decisions/parser.md) and their tricky neighbours
    case("article1-action-params", 'Thought: 需要搜索\nAction: search\nAction_Params: {"query": "2024年北京GDP"}',
         thought="需要搜索", call=("search", {"query": "2024年北京GDP"})),
    case("action-params-spaced", 'Action: calculator\nAction Params: {"expression": "pi * 5 ** 2"}',
         call=("calculator", {"expression": "pi * 5 ** 2"})),
    case("action-parameters", 'Action: search\nAction Parameters: {"query": "x"}', call=("search", {"query": "x"})),
    case("bracket-double-quotes-stripped", 'Thought: t\nAction: Calculator["2024 - 1982"]',
         thought="t", call=("Calculator", "2024 - 1982"), warnings=["bracket_action"]),
    case("bracket-double-quotes-unicode", 'Action: Search["Chloé Zhao birth year"]',
         call=("Search", "Chloé Zhao birth year"), warnings=["bracket_action"]),
    case("bracket-json-escapes", 'Action: Search["say \\"hi\\""]', call=("Search", 'say "hi"'),
         warnings=["bracket_action"]),
    case("bracket-single-quotes-stripped", "Action: Search['Nomadland director']",
         call=("Search", "Nomadland director"), warnings=["bracket_action"]),
    case("bracket-chinese-quotes-stripped", "Action: Search[“北京 天气”]", call=("Search", "北京 天气"),
         warnings=["bracket_action"]),
    case("bracket-corner-quotes-stripped", "Action: Search[「上海 天气」]", call=("Search", "上海 天气"),
         warnings=["bracket_action"]),
    case("bracket-two-quoted-strings-kept", 'Action: Search["a", "b"]', call=("Search", '"a", "b"'),
         warnings=["bracket_action"]),
    case("bracket-inner-quote-kept", "Action: Search['it's']", call=("Search", "'it's'"),
         warnings=["bracket_action"]),
    case("bracket-json-object", 'Action: search[{"query": "x"}]', call=("search", {"query": "x"}),
         warnings=["bracket_action"]),
    case("bracket-nested-brackets", "Action: python[print([1, 2])]", call=("python", "print([1, 2])"),
         warnings=["bracket_action"]),
    case("bracket-trailing-period", "Action: Search[Nomadland].", call=("Search", "Nomadland"),
         warnings=["bracket_action"]),
    case("bracket-chinese-name", "Action: 搜索[北京天气]", call=("搜索", "北京天气"), warnings=["bracket_action"]),
    case("chinese-dongzuo-shuru", "思考：需要搜索\n动作：search\n输入：北京今天天气",
         thought="需要搜索", call=("search", "北京今天天气"), warnings=[PSI]),
    case("chinese-dongzuo-ascii-colon", '思考: t\n动作: search\n输入: {"query": "上海"}',
         thought="t", call=("search", {"query": "上海"})),
    case("chinese-dongzuo-shuru-compound", '动作：search\n动作输入：{"query": "上海"}',
         call=("search", {"query": "上海"})),
    case("final-answer-may-start-a-line-with-shuru", "最终答案：第一行\n输入法不影响答案",
         final="第一行\n输入法不影响答案"),
    case("name-cut-at-signature", 'Action: search(query: str)\nAction Input: {"query": "x"}',
         call=("search", {"query": "x"})),
    case("name-cut-at-description", 'Action: add (add two numbers)\nAction Input: {"a": 1, "b": 2}',
         call=("add", {"a": 1, "b": 2})),
    case("name-cut-at-copied-listing-line", "Action: search(query: str) - Look up facts.\nAction Input: x",
         call=("search", "x"), warnings=[PSI]),
    case("name-cut-full-width-paren", 'Action: search（查询）\nAction Input: {"query": "x"}',
         call=("search", {"query": "x"})),
    case("input-with-parens-untouched", 'Action: calculator\nAction Input: {"expression": "(2 + 3) * 4"}',
         call=("calculator", {"expression": "(2 + 3) * 4"})),
    case("plain-input-with-parens-untouched", "Action: calculator (math)\nAction Input: sqrt(16) + (1)",
         call=("calculator", "sqrt(16) + (1)"), warnings=[PSI]),
    case("call-syntax-quoted", 'Action: search("capital of France")', call=("search", "capital of France"),
         warnings=["call_syntax_action"]),
    case("call-syntax-json-object", 'Action: search({"query": "x"})', call=("search", {"query": "x"}),
         warnings=["unlabelled_action_input", "trailing_text"]),
    case("call-syntax-signature-is-not-an-argument", "Action: search(query: str)",
         error="missing_action_input"),
    case("partial-stop-obs", "Thought: t\nAction: search\nAction Input: capital of France\nObs",
         thought="t", call=("search", "capital of France"), warnings=[PSI, "partial_stop_sequence"]),
    case("partial-stop-observ", "Action: search\nAction Input: capital of France\nObserv",
         call=("search", "capital of France"), warnings=[PSI, "partial_stop_sequence"]),
    case("partial-stop-observation-no-colon", 'Action: search\nAction Input: {"query": "x"}\nObservation\n',
         call=("search", {"query": "x"}), warnings=["partial_stop_sequence"]),
    case("partial-stop-chinese", "行动：search\n行动输入：北京\n观察", call=("search", "北京"),
         warnings=[PSI, "partial_stop_sequence"]),
    case("partial-stop-chinese-one-char", "行动：search\n行动输入：北京\n观", call=("search", "北京"),
         warnings=[PSI, "partial_stop_sequence"]),
    case("partial-stop-in-final-answer", "Final Answer: Paris\nObs", final="Paris",
         warnings=["partial_stop_sequence"]),
    case("word-ending-an-input-is-kept", "Action: search\nAction Input: Obsidian", call=("search", "Obsidian"),
         warnings=[PSI]),
    case("last-line-not-a-stop-prefix-kept", "Final Answer: see below\nObvious", final="see below\nObvious"),
    case("lowercase-obs-line-kept", "Final Answer: the notes\nobs", final="the notes\nobs"),
    case("final-answer-with-brackets", "Thought: done\nFinal Answer: use Search[x] and f(y) [1]",
         thought="done", final="use Search[x] and f(y) [1]"),
    case("text-after-bracket", "Thought: t\nAction: Lookup[x] on different website",
         thought="t", error="text_after_bracket"),
    case("action-none", "Thought: I know it\nAction: None", thought="I know it", error="no_tool"),
    case("action-none-with-input", "Action: None\nAction Input: {}", error="no_tool"),
    case("action-na", "Action: N/A", error="no_tool"),
    case("action-none-bracket", "Action: None[]", error="no_tool", warnings=["bracket_action"]),
    case("action-login-no-input", "Thought: I must log in\nAction: Login", thought="I must log in",
         error="missing_action_input"),
    case("action-is-a-sentence", "Action: Login to the website", error="missing_action_input"),
    # --- errors
    case("empty-string", "", error="empty"),
    case("whitespace", " \n\t \r\n", error="empty"),
    case("none", None, error="empty"),
    case("prose-no-label", "The capital of France is Paris.", error="garbage"),
    case("binary-junk", "\x00\x01\xff\ufffd\x7f\x1b[31m", error="garbage"),
    case("thought-alone", "Thought: I should think more about this.",
         thought="I should think more about this.",
         error="no_action"),
    case("input-without-action", 'Thought: t\nAction Input: {"query": "x"}', thought="t", error="no_action"),
    case("action-without-input", "Thought: t\nAction: search", thought="t", error="missing_action_input"),
    case("action-with-prose-after", "Thought: t\nAction: search\nI will now search.", thought="t",
         error="missing_action_input"),
    case("action-without-name", 'Thought: t\nAction:\nAction Input: {"query": "x"}', thought="t",
         error="missing_action_name"),
    case("action-label-mid-line-not-a-label", "I think the Action: search would help", error="garbage"),
    # --- a tool call written as JSON or in call tags instead (Qwen, Hermes, Llama, Mistral; more: test_model_output)
    case("json-call-instead-of-labels", '{"name": "search", "arguments": {"query": "x"}}',
         call=("search", {"query": "x"}), warnings=["text_tool_call"]),
    case("tool-call-tags-after-a-thought", 'Thought: t\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}'
         "\n</tool_call>", thought="t", call=("search", {"query": "x"}), warnings=["text_tool_call"]),
    case("unreadable-call-tags", "<tool_call>search(x)</tool_call>", error="invalid_text_call"),
    # --- the format hint's placeholders copied back (0.5B models do); a `<…>` tool name: the engine decides
    case("echoed-placeholders", "Thought: t\nAction: <tool name>\nAction Input: <JSON arguments>", thought="t",
         error="placeholder", warnings=[PSI]),
    case("echoed-input-placeholder", "Action: search\nAction Input: <JSON arguments>", error="placeholder",
         warnings=[PSI]),
    case("echoed-final-answer-placeholder", "Thought: t\nFinal Answer: <answer>", thought="t", error="placeholder"),
    case("prompt-line-echoed-as-answer", "Final Answer: the final answer to the question.", error="placeholder"),
    case("placeholder-name-with-real-input", 'Action: <tool name>\nAction Input: {"query": "x"}',
         call=("<tool name>", {"query": "x"})),
    case("angle-brackets-in-a-real-answer", "Final Answer: <html>", final="<html>"),
    case("angle-brackets-in-a-real-input", "Action: python\nAction Input: <b>bold</b>", call=("python", "<b>bold</b>"),
         warnings=[PSI]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "thought", "call", "final", "error", "warnings"), TEXT_CASES)
def test_parse_text(text, thought, call, final, error, warnings):
    turn = parse_text(text)
    assert turn.thought == thought
    assert [(c.name, c.arguments) for c in turn.calls] == ([call] if call else [])
    assert turn.final_answer == final
    assert turn.error_kind == error
    assert sorted(turn.warnings) == warnings
    if call:
        assert turn.calls[0].id == "text-0"
    if error:
        assert turn.error and turn.error.startswith("Invalid format")
    else:
        assert turn.error is None


def test_table_is_exhaustive_enough():
    assert len(TEXT_CASES) >= 60
    kinds = {p.values[4] for p in TEXT_CASES} - {None}
    assert kinds == set(PARSE_ERROR_KINDS)


EXAMPLE = FormatExample(tool="calculator", arguments='{"expression": "(17 + 25) * 3"}')


def test_format_errors_tell_the_model_what_to_write():
    """With a concrete call of an offered tool (prompts.format_example), never a placeholder that a small
    model copies back (`Action: <tool name>`)."""
    for text in (None, "blah", "Thought: hmm", "Action:", "Action: search", "Action: Login to the website"):
        error = parse_text(text, EXAMPLE).error
        assert error is not None
        assert 'Action: calculator\nAction Input: {"expression": "(17 + 25) * 3"}' in error and "Final Answer:" in error
        assert "<" not in error and "..." not in error
        generic = parse_text(text).error or ""  # no example (no tools offered): said in words
        assert "'Action:'" in generic and "'Action Input:'" in generic and "<" not in generic
    bad = parse_text("Action: calculator\nAction Input: {bad", EXAMPLE).error or ""
    assert bad.endswith('e.g.\nAction Input: {"expression": "(17 + 25) * 3"}')
    other = parse_text("Action: s\nAction Input: {bad", EXAMPLE).error or ""
    assert 'e.g. (for calculator)\nAction Input: {"expression": "(17 + 25) * 3"}' in other
    assert '{"query": "capital of France"}' in (parse_text("Action: s\nAction Input: {bad").error or "")
    assert "'Action: search'" in (parse_text("Action: search").error or "")
    for text in ("Final Answer:", "Action: None", "Action: Lookup[x] more"):
        assert "<" not in (parse_text(text, EXAMPLE).error or "")


def test_huge_inputs_complete():
    one_mb = 1_000_000
    texts = [
        "a" * one_mb,
        "Thought: " + "x" * one_mb,
        "Action: s\nAction Input: " + "{" * one_mb,
        "Action: s\nAction Input: {'a': " + "[" * one_mb,
        "Action: s\nAction Input: " + '{"a": "' + "\\" * one_mb,
        "Observation:\n" * (one_mb // 13),
        "Action: x\n" * (one_mb // 10),
        "**" * (one_mb // 2),
        "Action: Search[" + "[" * one_mb,
        "Thought 1 :" * (one_mb // 11),
        "```" * (one_mb // 3),
        "Final Answer: " + "\n" * one_mb + "done",
        "Action: a[" + "]b" * (one_mb // 2),
        "Action: a(" + ")b" * (one_mb // 2),
        'Action: a["' + '"' * one_mb + "]",
        "Action: a\nAction Input: x\n" + " " * one_mb + "Obs",
    ]
    for text in texts:
        turn = parse_text(text)
        assert _exactly_one_outcome(turn)
    assert parse_text("Final Answer: " + "y" * one_mb).final_answer == "y" * one_mb


def test_stop_sequences_cover_the_observation_labels():
    assert "\nObservation:" in TEXT_STOP_SEQUENCES
    assert {"\n观察:", "\n观察："} <= set(TEXT_STOP_SEQUENCES)
    assert len(TEXT_STOP_SEQUENCES) <= 4  # the OpenAI API limit


# --- native function calling


def _call(arguments, name="search", id="call_1"):
    return ToolCall(id=id, name=name, arguments=arguments)


def test_tool_reply_decodes_json_string_arguments():
    turn = parse_tool_reply(None, [_call('{"query": "x"}'), _call({"a": 1}, name="calc", id="call_2")])
    assert [(c.id, c.name, c.arguments) for c in turn.calls] == [
        ("call_1", "search", {"query": "x"}),
        ("call_2", "calc", {"a": 1}),
    ]
    assert turn.thought is None and turn.final_answer is None and turn.error is None
    assert turn.warnings == []


@pytest.mark.parametrize("raw", ['{"query": ', '["x"]', '"x"', "42", "not json", "{" * 5000])
def test_tool_reply_keeps_bad_arguments_raw_and_warns(raw):
    turn = parse_tool_reply("", [_call(raw), _call('{"ok": true}', id="call_2")])
    assert [c.arguments for c in turn.calls] == [raw, {"ok": True}]
    assert turn.warnings == ["invalid_tool_arguments"]
    assert turn.error is None and turn.error_kind is None


def test_tool_reply_empty_argument_string_is_empty_object():
    assert parse_tool_reply(None, [_call("  ")]).calls[0].arguments == {}


def test_tool_reply_fills_missing_call_ids():
    assert [c.id for c in parse_tool_reply(None, [_call("{}", id=""), _call("{}", id="")]).calls] == [
        "call-0",
        "call-1",
    ]


@pytest.mark.parametrize(
    ("content", "thought"),
    [("I will search.", "I will search."), ("Thought: I will search.", "I will search."), ("  ", None)],
)
def test_tool_reply_content_beside_calls_is_the_thought(content, thought):
    turn = parse_tool_reply(content, [_call("{}")])
    assert turn.thought == thought
    assert len(turn.calls) == 1 and turn.final_answer is None


@pytest.mark.parametrize(
    ("content", "thought", "final"),
    [
        ("Paris", None, "Paris"),
        ("  Paris is the capital.\n\nIt is large.  ", None, "Paris is the capital.\n\nIt is large."),
        ("Final Answer: Paris", None, "Paris"),
        ("final answer： Paris", None, "Paris"),
        ("**Final Answer:** Paris", None, "Paris"),
        ("Thought: easy\nFinal Answer: Paris\nmore", "easy", "Paris\nmore"),
        ("最终答案：巴黎", None, "巴黎"),
    ],
)
def test_tool_reply_without_calls_is_the_final_answer(content, thought, final):
    turn = parse_tool_reply(content, [])
    assert (turn.thought, turn.final_answer, turn.error) == (thought, final, None)


@pytest.mark.parametrize(("content", "kind"), [(None, "empty"), ("", "empty"), (" \n", "empty"),
                                               ("Final Answer:", "empty_final_answer")])  # fmt: skip
def test_tool_reply_empty(content, kind):
    turn = parse_tool_reply(content, [])
    assert turn.error_kind == kind and turn.error
    assert turn.calls == [] and turn.final_answer is None


# --- properties over random input


def _exactly_one_outcome(turn: ParsedTurn) -> bool:
    outcomes = [bool(turn.calls), turn.final_answer is not None, turn.error is not None]
    return (
        sum(outcomes) == 1
        and (turn.error is None) == (turn.error_kind is None)
        and (turn.error_kind is None or turn.error_kind in PARSE_ERROR_KINDS)
        and set(turn.warnings) <= set(PARSE_WARNINGS)
        and len(turn.calls) <= 1
    )


_PIECES = [
    "Thought", "Action", "Action Input", "Final Answer", "Observation", "Act 1", "Obs", "思考", "行动",
    "行动输入", "观察", "最终答案", "Finish", "Search", ":", "：", "**", "[", "]", "{", "}", '"', "'",
    "`", "```", "```json", "\n", "\r\n", "\r", " ", "\t", "1", "x", "é", "🗼", "\x00", "\\", ",", "null",
    '{"query": "x"}', "{'a': 1}", "()", ".", "Action_Params", "动作", "输入", "“", "”", "「", "」", "(", ")",
    "None", "Obs", "观", " - ",
]  # fmt: skip


_LABELS = ["Thought", "Action", "Action Input", "Final Answer", "Observation", "行动", "行动输入", "**Action",
           "Action_Params", "动作", "输入"]


def test_fuzz_never_raises():
    rng = random.Random(20240501)
    for _ in range(2000):
        roll = rng.random()
        if roll < 0.5:  # label-shaped lines, so the deeper branches are reached
            text = "\n".join(
                rng.choice(_LABELS) + rng.choice(("", " 1", "**")) + rng.choice(":：") + " "
                + "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 6)))
                for _ in range(rng.randint(1, 6))
            )  # fmt: skip
        elif roll < 0.85:
            text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 40)))
        else:
            text = "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 200)))
        turn = parse_text(text)
        assert _exactly_one_outcome(turn), (text, turn)
        tool_turn = parse_tool_reply(text, [_call(text)] if rng.random() < 0.5 else [])
        assert _exactly_one_outcome(tool_turn) or tool_turn.calls, (text, tool_turn)


def test_public_api():
    assert sorted(parser_module.__all__) == sorted(
        ["PARSE_ERROR_KINDS", "PARSE_WARNINGS", "TEXT_STOP_SEQUENCES", "ParsedTurn", "parse_text",
         "parse_tool_reply", "join_reasoning", "split_reasoning", "text_tool_calls", "FormatExample",
         "is_placeholder_name"]
    )  # fmt: skip


def test_errors_name_what_is_wrong():
    after = parse_text("Action: Lookup[x] on different website").error or ""
    assert "unexpected text after the closing bracket: 'on different website'" in after
    assert "Action: Lookup[x]" in after
    none = parse_text("Action: None").error or ""
    assert "'Action: None' means no tool: give a Final Answer" in none and "'Final Answer:' followed by" in none
    login = parse_text("Action: Login").error or ""
    assert "'Action: Login' is not followed by an 'Action Input:' line" in login
    assert "no 'Action Input:' label" in (parse_text("Action: search\nI will now search.").error or "")
    assert "is not a tool name" in (parse_text("Action: Login to the website").error or "")
    for text in ("Action: Lookup[x] on different website", "Action: None", "Action: Login"):
        assert "missing Action Input" not in (parse_text(text).error or "")


def test_the_articles_examples_parse_end_to_end():
    """The seed articles' worked replies, verbatim, reach the right tool with clean arguments."""
    article1 = ("Thought: 用户问的是2024年北京的GDP，这个数据是实时的，我需要调用搜索工具获取最新数据\n"
                'Action: search\nAction_Params: {"query": "2024年北京GDP"}')  # fmt: skip
    article2 = "Thought: 我需要查询北京今天的天气。\nAction: search\nAction Input: 北京今天天气"
    article3 = ("Thought: 我知道 Chloé Zhao 的出生年份是 1982。现在我需要计算她到 2024 年的年龄。\n"
                'Action: Calculator["2024 - 1982"]')  # fmt: skip
    got = [(t.calls[0].name, t.calls[0].arguments) for t in map(parse_text, (article1, article2, article3))]
    assert got == [("search", {"query": "2024年北京GDP"}), ("search", "北京今天天气"), ("Calculator", "2024 - 1982")]
    assert parse_text("Thought: 根据之前的计算，年龄是 42 岁。\nFinal Answer: 42").final_answer == "42"


def test_a_reply_cut_inside_each_stop_sequence_keeps_a_clean_input():
    for stop in TEXT_STOP_SEQUENCES:
        for cut in range(2, len(stop)):  # "\nO", "\nOb", ... ; the whole sequence is removed by the API
            if stop[1:cut] in ("O", "Ob"):  # too short to tell from text
                continue
            turn = parse_text("Action: search\nAction Input: capital of France" + stop[:cut])
            assert turn.calls[0].arguments == "capital of France", (stop, cut)
