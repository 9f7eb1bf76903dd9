"""Inline tools: the calculator, offline search and the SerpAPI backend (against a real local HTTP
server), and the tool registry."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from pydantic import BaseModel, Field

from worker.core.engine import Act, Limits, decide
from worker.core.models import Run, RunSpec
from worker.core.models import ToolCall as ToolCallModel
from worker.core.parser import parse_text, parse_tool_reply
from worker.tools import REGISTRY
from worker.tools import calculator as calc
from worker.tools.registry import InvalidArguments, Tool, ToolError, ToolRegistry, tool
from worker.tools.search import TOP_K, OfflineCorpus, format_results, serpapi_search

# --- calculator ----------------------------------------------------------------------------------

CALC_CASES = [
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("10 - 4 - 3", 3),
    ("2 ** 3 ** 2", 512),
    ("2 ^ 10", 1024),
    ("2^3^2", 512),
    ("-2 ** 2", -4),
    ("(-2) ** 2", 4),
    ("--3", 3),
    ("+5", 5),
    ("-(3 - 5)", 2),
    ("7 / 2", 3.5),
    ("7 // 2", 3),
    ("-7 // 2", -4),
    ("7 % 3", 1),
    ("3 × 4", 12),
    ("12 ÷ 4", 3.0),
    ("  (17 + 25) * 3  ", 126),
    ("sqrt(1764)", 42.0),
    ("abs(-3)", 3),
    ("round(2.567, 2)", 2.57),
    ("floor(2.7) + ceil(2.1)", 5),
    ("min(4, 2, 8)", 2),
    ("max(4, 2, 8)", 8),
    ("pow(2, 10)", 1024),
    ("pow(3, 200, 7)", pow(3, 200, 7)),
    ("log(e)", 1.0),
    ("log10(1000)", 3.0),
    ("log2(8)", 3.0),
    ("log(8, 2)", 3.0),
    ("exp(0)", 1.0),
    ("factorial(5)", 120),
    ("factorial(5.0)", 120),
    ("factorial(0)", 1),
    ("sin(0) + cos(0)", 1.0),
    ("pi", math.pi),
    ("tau / 2", math.pi),
    ("2 ** 0.5", math.sqrt(2)),
    ("0.5 ** 100000", 0.0),
    ("1 ** 100000", 1),
    ("1e3 + 1", 1001.0),
    ("2 ** 9999", 2**9999),
]


@pytest.mark.parametrize(("expression", "expected"), CALC_CASES)
def test_calculator_evaluates(expression, expected):
    result = calc.evaluate(expression)
    assert result == pytest.approx(expected)
    assert type(result) is type(expected) or isinstance(expected, float)


ERROR_CASES = [
    ("1 / 0", "division_by_zero", "division by zero"),
    ("5 // 0", "division_by_zero", "division by zero"),
    ("5 % 0", "division_by_zero", "division by zero"),
    ("1 / (2 - 2)", "division_by_zero", "division by zero"),
    ("10 ** 100000", "too_large", "power too large"),
    ("9 ** 9 ** 9", "too_large", "power too large"),
    ("2 ^ 99999", "too_large", "power too large"),
    ("pow(10, 100000)", "too_large", "power too large"),
    ("pow(9, pow(9, 9))", "too_large", "power too large"),
    ("9 ** 9999", "too_large", "more than 4000 digits"),
    ("factorial(1000) * factorial(1000)", "too_large", "more than 4000 digits"),
    ("10.0 ** 400", "too_large", "too large"),
    ("1e308 * 10", "too_large", "too large"),
    ("exp(1000)", "too_large", "too large"),
    ("factorial(1001)", "too_large", "max 1000"),
    ("factorial(-1)", "math_domain", "non-negative whole number"),
    ("factorial(2.5)", "math_domain", "non-negative whole number"),
    ("sqrt(-1)", "math_domain", "math error"),
    ("log(0)", "math_domain", "math error"),
    ("(-8) ** (1/3)", "math_domain", "complex"),
    ("min()", "math_domain", "math error"),
    ("", "syntax", "empty expression"),
    ("   ", "syntax", "empty expression"),
    ("1 +", "syntax", "cannot parse"),
    ("2 + 3)", "syntax", "cannot parse"),
    ("1" * 501, "too_large", "longer than 500"),
    ("x + 1", "unknown_name", "unknown name 'x'; known constants: pi, e, tau"),
    ("__import__('os')", "unknown_name", "unknown function '__import__'"),
    ("open('/etc/passwd')", "unknown_name", "unknown function 'open'"),
    ("foo(1)", "unknown_name", "known functions: sqrt, log,"),
    ("(1).__class__", "syntax", "unsupported syntax"),
    ("math.pi", "syntax", "unsupported syntax"),
    ("sqrt.__self__", "syntax", "unsupported syntax"),
    ("(lambda: 1)()", "syntax", "unsupported syntax"),
    ("lambda x: x", "syntax", "unsupported syntax"),
    ("[x for x in (1, 2)]", "syntax", "unsupported syntax"),
    ("max(i for i in (1, 2))", "syntax", "unsupported syntax"),
    ("'a' * 3", "syntax", "unsupported syntax"),
    ("True + 1", "syntax", "unsupported syntax"),
    ("1j * 2", "syntax", "unsupported syntax"),
    ("1 << 100000", "syntax", "unsupported syntax"),
    ("1 < 2", "syntax", "unsupported syntax"),
    ("round(x=1)", "syntax", "unsupported syntax"),
    ("max(*(1, 2))", "syntax", "unsupported syntax"),
    ("sqrt(4)(2)", "syntax", "unsupported syntax"),
    ("(1, 2)", "syntax", "unsupported syntax"),
]


@pytest.mark.parametrize(("expression", "error_type", "message"), ERROR_CASES)
def test_calculator_errors(expression, error_type, message):
    started = time.thread_time()
    with pytest.raises(ToolError) as info:
        calc.evaluate(expression)
    assert time.thread_time() - started < 1.0  # huge powers are refused before they are computed
    assert info.value.error_type == error_type
    assert message in str(info.value)


# Expressions of at most 500 characters that took seconds to hours of CPU (holding the GIL) before the
# calculator bounded each operation before computing it; each figure is what computing it costs.
BOMBS = [
    ("round(1, -10**7)", "round digits out of range"),  # 7 s: builds 10**(10**7)
    ("round(1, -10**9)", "round digits out of range"),  # hours
    ("round(10**3999, -10**6)", "round digits out of range"),
    ("round(2.5, 10**30)", "round digits out of range"),
    ("(10**4000)**10000", "more than 4000 digits"),  # > 30 s: passed the exponent check
    ("(10**4000)**9999", "more than 4000 digits"),
    ("(2**9999)**9999", "more than 4000 digits"),
    ("((10**400)**10)**10", "more than 4000 digits"),
    ("(10**50)**(10**3)", "more than 4000 digits"),
    ("pow(10**4000, 10000)", "more than 4000 digits"),
    ("pow(pow(10, 4000), pow(10, 4))", "more than 4000 digits"),
    ("factorial(1000)**10", "more than 4000 digits"),
    ("factorial(1000)**factorial(7)", "more than 4000 digits"),
    ("factorial(1000)*factorial(1000)*factorial(1000)", "more than 4000 digits"),
    ("10**4000*10**4000", "more than 4000 digits"),
    ("(10**4000)*(10**4000)*(10**4000)*(10**4000)", "more than 4000 digits"),
    ("10**4000*10**4000*10**4000*10**4000*10**4000*10**4000*10**4000*10**4000", "more than 4000 digits"),
    ("floor(1e308)**100", "more than 4000 digits"),
    ("(-10**4000)**9999", "more than 4000 digits"),
    ("9**9**9**9", "power too large"),
    ("2**2**2**2**2**2", "power too large"),
    ("(10**4000)**(10**4000)", "power too large"),
    ("10**(10**4000)", "power too large"),
    ("2.0**(10**400)", "power too large"),
    ("pow(10**3999+7, 10**3999+1, 10**3999+9)", "modular power too large"),  # 4 s
    ("pow(2, 10**3999, 10**3999+9)", "modular power too large"),
    ("pow(7, 2**4095+3, 2**4096-1)", "modular power too large"),  # 0.1 s
    ("pow(3, 5, 10**400)", "modular power too large"),
    ("factorial(10**9)", "max 1000"),
    ("factorial(factorial(10))", "max 1000"),
    ("factorial(1e300)", "max 1000"),
    ("1e999", "too large"),
    ("1e999 - 1e999", "too large"),
    ("exp(10**4000)", "too large"),
    ("sqrt(10**4000)", "too large"),
    ("(10**4000)/3", "too large"),
    ("factorial(1000)/factorial(1000)*1e308*10", "too large"),
    ("round(1e400)", "too large"),
]


@pytest.mark.parametrize(("expression", "message"), BOMBS)
def test_calculator_bombs_are_refused_before_they_are_computed(expression, message):
    """Each is a `too_large` error within milliseconds of CPU time (this thread's, so a loaded machine does
    not change it); computed, the slowest would hold a worker's GIL for hours."""
    assert len(expression) <= calc.MAX_EXPRESSION_CHARS
    started = time.thread_time()
    with pytest.raises(ToolError) as info:
        calc.evaluate(expression)
    assert time.thread_time() - started < 0.05
    assert info.value.error_type == "too_large"
    assert message in str(info.value)


def test_unsupported_shifts_and_comparisons_are_refused_unevaluated():
    for expression in ("1 << 10**9", "10**9 >> 1", "2 ** 10 ** 9 > 1"):
        with pytest.raises(ToolError) as info:
            calc.evaluate(expression)
        assert info.value.error_type in ("syntax", "too_large")


BIG_BUT_FINE = [
    ("round(10**3999 + 1, -3999)", 10**3999),
    ("round(12345, -2)", 12300),
    ("round(2.675, 4000)", 2.675),
    ("round(1.5, -4000)", 0.0),
    ("10**4000 // 10**3999", 10),
    ("factorial(1000) // factorial(999)", 1000),
    ("factorial(1000) * factorial(600) // factorial(600)", math.factorial(1000)),
    ("3 ** 8000 % 1000", pow(3, 8000, 1000)),
    ("pow(2**1023 + 1, 2**1023 + 3, 2**1024 - 1)", pow(2**1023 + 1, 2**1023 + 3, 2**1024 - 1)),
    ("pow(10**3999, 65537, 2**1024 - 1)", pow(10**3999, 65537, 2**1024 - 1)),
    ("(-1) ** (10**400)", 1),
    ("0 ** (10**400)", 0),
    ("1 ** (10**4000)", 1),
    ("(10**400) ** 10", 10**4000),
    ("2 ** 10000 - 2 ** 9999", 2**9999),
    ("2 ** -10000", 0.0),
    ("log(10**3999, 10)", 3999.0),
    ("max(10**3999, 10**3998) - min(5, 6)", 10**3999 - 5),
]


@pytest.mark.parametrize(("expression", "expected"), BIG_BUT_FINE)
def test_large_ordinary_math_still_works(expression, expected):
    started = time.thread_time()
    result = calc.evaluate(expression)
    assert time.thread_time() - started < 0.05
    assert result == (expected if isinstance(expected, int) else pytest.approx(expected))


def test_unknown_function_lists_every_known_function():
    with pytest.raises(ToolError) as info:
        calc.evaluate("median(1, 2)")
    for name in calc.FUNCTIONS:
        assert name in str(info.value)


def test_calculator_never_uses_eval(monkeypatch):
    import builtins

    def forbidden(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("eval called")

    monkeypatch.setattr(builtins, "eval", forbidden)
    assert calc.evaluate("6 * 7") == 42


def test_deep_nesting_is_handled():
    assert calc.evaluate("-" * 400 + "1") == 1
    assert calc.evaluate("(" * 150 + "2" + ")" * 150) == 2


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (42, "42"),
        (-7, "-7"),
        (42.0, "42"),
        (-3.0, "-3"),
        (0.0, "0"),
        (3.5, "3.5"),
        (0.1 + 0.2, "0.3"),
        (1 / 3, "0.333333333333"),
        (math.pi, "3.14159265359"),
        (1e20, "1e+20"),
        (1e-7, "1e-07"),
        (2**70, str(2**70)),
    ],
)
def test_format_number(value, text):
    assert calc.format_number(value) == text


def test_builtin_calculator_tool_formats_its_result():
    t = REGISTRY.get("calculator")
    assert t is not None and t.idempotent and not t.sandboxed
    assert t.run(t.validate({"expression": "sqrt(1764)"})) == "42"
    assert t.run(t.validate("2 ^ 10")) == "1024"
    with pytest.raises(ToolError) as info:
        t.run(t.validate({"expression": "1/0"}))
    assert info.value.error_type == "division_by_zero"


# --- offline search --------------------------------------------------------------------------------

DOCS = [
    {"title": "Paris", "text": "Paris is the capital of France, on the Seine."},
    {"title": "Berlin", "text": "Berlin is the capital of Germany."},
    {"title": "Seine", "text": "The Seine is a river that flows through Paris and Rouen to the sea."},
    {"title": "Python", "text": "Python is a programming language created by Guido van Rossum."},
    {"title": "Mount Everest", "text": "Everest is the highest mountain, 8849 metres tall."},
]


@pytest.fixture
def corpus() -> OfflineCorpus:
    return OfflineCorpus(DOCS)


def titles(results) -> list[str]:
    return [r["title"] for r in results]


def test_search_ranks_the_best_match_first(corpus):
    assert titles(corpus.search("capital of Germany"))[0] == "Berlin"
    assert titles(corpus.search("Who created the Python programming language?")) == ["Python"]
    assert titles(corpus.search("how tall is Everest"))[0] == "Mount Everest"


def test_search_title_counts_more_than_text(corpus):
    # "Seine" appears in the Paris text once, but is the title of its own document
    assert titles(corpus.search("Seine"))[:2] == ["Seine", "Paris"]
    assert titles(corpus.search("Paris"))[0] == "Paris"


def test_search_is_case_insensitive_and_ignores_punctuation(corpus):
    assert corpus.search("BERLIN!!!") == corpus.search("berlin")


def test_search_returns_at_most_k(corpus):
    results = corpus.search("capital Paris Berlin Seine Python Everest")
    assert len(results) == TOP_K
    assert len(corpus.search("capital Paris Berlin Seine", k=1)) == 1


def test_search_without_matches_or_with_only_stop_words(corpus):
    assert corpus.search("zebra quantum") == []
    assert corpus.search("what is the") == []
    assert corpus.search("") == []


def test_rare_terms_outweigh_common_ones():
    docs = [{"title": f"doc {i}", "text": "common words here"} for i in range(5)]
    docs.append({"title": "special", "text": "common words and a rare unicorn"})
    assert titles(OfflineCorpus(docs).search("common unicorn"))[0] == "special"


def test_empty_corpus():
    assert OfflineCorpus([]).search("anything") == []


def test_format_results():
    results = [{"title": "A", "text": "first"}, {"title": "B", "text": "second"}]
    assert format_results("q", results) == "1. A: first\n2. B: second"
    assert format_results("it's", []) == 'No results for "it\'s".'
    assert format_results("zebra", []) == "No results for 'zebra'."


# --- SerpAPI, up to the network boundary ---------------------------------------------------------


class _FakeSerpApi(BaseHTTPRequestHandler):
    """Answers every GET with the server's configured status and body, and records the path."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        config = self.server.config  # type: ignore[attr-defined]
        self.send_response(config["status"])
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(config["body"])))
        self.end_headers()
        self.wfile.write(config["body"])

    def log_message(self, *_args: Any) -> None:
        pass


SERP_PAYLOAD = {
    "search_metadata": {"status": "Success"},
    "answer_box": {"answer": "8,849 m"},
    "organic_results": [
        {"position": 1, "title": "Mount Everest - Wikipedia", "snippet": "Everest is Earth's highest mountain."},
        {"position": 2, "title": "Height of Everest", "snippet": "Surveyed at 8,848.86 m in 2020."},
        {"position": 3, "title": "Third", "snippet": "cut by TOP_K"},
    ],
}


@pytest.fixture
def serp_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSerpApi)
    server.requests = []  # type: ignore[attr-defined]
    server.config = {"status": 200, "body": json.dumps(SERP_PAYLOAD).encode()}  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5.0) as c:
        yield c


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/search.json"


def test_serpapi_sends_the_query_and_key_and_reads_the_results(serp_server, client):
    results = serpapi_search("how tall is Everest?", "secret-key", client, url=url_of(serp_server))
    assert results == [
        {"title": "Answer", "text": "8,849 m"},
        {"title": "Mount Everest - Wikipedia", "text": "Everest is Earth's highest mountain."},
        {"title": "Height of Everest", "text": "Surveyed at 8,848.86 m in 2020."},
    ]
    [path] = serp_server.requests
    parts = urlsplit(path)
    assert parts.path == "/search.json"
    assert parse_qs(parts.query) == {
        "q": ["how tall is Everest?"],
        "api_key": ["secret-key"],
        "engine": ["google"],
        "num": [str(TOP_K)],
    }


def test_serpapi_without_answer_box_or_results(serp_server, client):
    serp_server.config["body"] = json.dumps({"organic_results": [{"title": "T"}]}).encode()
    assert serpapi_search("q", "k", client, url=url_of(serp_server)) == [{"title": "T", "text": ""}]
    serp_server.config["body"] = b"{}"
    results = serpapi_search("nothing", "k", client, url=url_of(serp_server))
    assert format_results("nothing", results) == "No results for 'nothing'."


def test_serpapi_http_error_is_a_tool_error(serp_server, client):
    serp_server.config.update(status=500, body=b'{"error": "internal"}')
    with pytest.raises(ToolError) as info:
        serpapi_search("q", "secret-key", client, url=url_of(serp_server))
    assert info.value.error_type == "search_http_error"
    assert "HTTP 500" in str(info.value)
    assert "secret-key" not in str(info.value)  # the key never reaches the model


def test_serpapi_unreadable_body_is_a_tool_error(serp_server, client):
    serp_server.config["body"] = b"<html>rate limited</html>"
    with pytest.raises(ToolError) as info:
        serpapi_search("q", "k", client, url=url_of(serp_server))
    assert info.value.error_type == "search_bad_response"


def test_serpapi_refused_connection_is_a_tool_error(client):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ToolError) as info:
        serpapi_search("q", "k", client, url=f"http://127.0.0.1:{port}/search.json")
    assert info.value.error_type == "search_unavailable"
    assert "ConnectError" in str(info.value)


# --- registry --------------------------------------------------------------------------------------


class WeatherArgs(BaseModel):
    city: str = Field(description="a city name")
    days: int = 1


class PairArgs(BaseModel):
    a: int
    b: int


def test_registry_lookup_is_case_insensitive():
    reg = ToolRegistry()
    t = reg.register(Tool("Weather", WeatherArgs, "Forecast."))
    assert reg.get("weather") is t
    assert reg.get("  WEATHER ") is t
    assert reg.get("forecast") is None
    assert reg.names() == ["Weather"]


def test_registry_names_and_all_are_sorted():
    reg = ToolRegistry()
    for name in ["zeta", "Alpha", "mid"]:
        reg.register(Tool(name, PairArgs, name))
    assert reg.names() == ["Alpha", "mid", "zeta"]
    assert [t.name for t in reg.all()] == ["Alpha", "mid", "zeta"]


def test_registering_the_same_name_replaces_the_tool():
    reg = ToolRegistry()
    reg.register(Tool("x", PairArgs, "old"))
    reg.register(Tool("X", PairArgs, "new"))
    assert [t.description for t in reg.all()] == ["new"]


def test_openai_schema_shape():
    schema = Tool("weather", WeatherArgs, "Forecast for a city.").openai_schema()
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "weather"
    assert fn["description"] == "Forecast for a city."
    params = fn["parameters"]
    assert params["type"] == "object"
    assert "title" not in params
    assert params["required"] == ["city"]
    assert params["properties"]["city"]["type"] == "string"
    assert params["properties"]["city"]["description"] == "a city name"
    assert params["properties"]["days"]["default"] == 1
    json.dumps(schema)  # serialisable as sent on the wire


def test_text_signature():
    assert Tool("weather", WeatherArgs, "Forecast.").text_signature() == "weather(city: str, days: int) - Forecast."


def test_validate_messages():
    t = Tool("pair", PairArgs, "two ints")
    assert t.validate({"a": 1, "b": "2"}) == PairArgs(a=1, b=2)
    with pytest.raises(InvalidArguments) as info:
        t.validate({"a": 1})
    assert info.value.error_type == "invalid_arguments"
    assert str(info.value) == (
        'invalid arguments for pair: b: Field required. Expected JSON like {"a": 3, "b": 3}'
    )
    with pytest.raises(InvalidArguments, match="pair takes a JSON object with fields"):
        t.validate("1 2")


def test_validate_string_for_one_required_field():
    t = Tool("weather", WeatherArgs, "Forecast.")
    assert t.validate("Oslo") == WeatherArgs(city="Oslo", days=1)
    with pytest.raises(InvalidArguments, match="not a valid JSON object"):
        t.validate('{"city": "Oslo"')


def test_tool_without_function_cannot_run_inline():
    with pytest.raises(ToolError) as info:
        Tool("p", PairArgs, "sandboxed", None, sandboxed=True).run(PairArgs(a=1, b=2))
    assert info.value.error_type == "not_inline"


def test_tool_decorator_registers_into_the_given_registry():
    reg = ToolRegistry()

    @tool("weather", WeatherArgs, "Current weather.", idempotent=True, registry=reg)
    def weather(args: WeatherArgs) -> str:
        return f"sunny in {args.city} for {args.days} day(s)"

    assert weather(WeatherArgs(city="Rome")) == "sunny in Rome for 1 day(s)"  # still a plain function
    t = reg.get("Weather")
    assert t is not None
    assert t.func is weather
    assert (t.idempotent, t.sandboxed) == (True, False)
    assert t.run(t.validate("Rome")) == "sunny in Rome for 1 day(s)"
    assert REGISTRY.get("weather") is None  # the global registry is untouched


def test_builtin_tools_are_registered():
    assert {"calculator", "search", "python"} <= set(REGISTRY.names())
    python = REGISTRY.get("python")
    assert python is not None and python.sandboxed
    search = REGISTRY.get("search")
    assert search is not None and search.idempotent
    with pytest.raises(InvalidArguments, match="query"):
        search.validate({"query": ""})


def test_aliases_reach_the_tool_in_any_case_and_are_never_listed():
    reg = ToolRegistry()
    t = reg.register(Tool("calculator", PairArgs, "math", aliases=("calc", "Calculate")))
    for name in ("calculator", "Calculator", "CALC", " calculate ", "Calculate"):
        assert reg.get(name) is t, name
    assert reg.get("calculus") is None
    assert reg.names() == ["calculator"]
    assert [x.name for x in reg.all()] == ["calculator"]


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (Tool("maths", PairArgs, "x", aliases=("calc",)), "'calc' is already the name or an alias of tool 'calc"),
        (Tool("maths", PairArgs, "x", aliases=("Calculator",)), "'calculator' is already the name"),
        (Tool("maths", PairArgs, "x", aliases=("",)), "an alias is empty"),
    ],
)
def test_an_alias_clash_is_refused_at_registration(second, message):
    reg = ToolRegistry()
    first = reg.register(Tool("calculator", PairArgs, "math", aliases=("calc",)))
    with pytest.raises(ValueError, match=message):
        reg.register(second)
    assert reg.get("calc") is first and reg.names() == ["calculator"]  # nothing half-registered


def test_a_name_wins_over_another_tools_alias():
    reg = ToolRegistry()
    calculator = reg.register(Tool("calculator", PairArgs, "math", aliases=("calc", "math")))
    calc = reg.register(Tool("calc", PairArgs, "a user's own tool called calc"))
    assert reg.get("calc") is calc and reg.get("math") is calculator
    assert reg.names() == ["calc", "calculator"]


def test_a_new_tools_alias_may_not_take_an_existing_name():
    reg = ToolRegistry()
    reg.register(Tool("search", PairArgs, "s"))
    with pytest.raises(ValueError, match="'search' is already the name or an alias of tool 'search'"):
        reg.register(Tool("web", PairArgs, "w", aliases=("search",)))


def test_replacing_a_tool_replaces_its_aliases():
    reg = ToolRegistry()
    reg.register(Tool("calculator", PairArgs, "old", aliases=("calc", "math")))
    new = reg.register(Tool("Calculator", PairArgs, "new", aliases=("calc",)))
    assert reg.get("calc") is new and reg.get("math") is None
    reg.register(Tool("math", PairArgs, "the alias is free again"))


def test_tool_decorator_takes_aliases():
    reg = ToolRegistry()

    @tool("weather", WeatherArgs, "Current weather.", aliases=("forecast", "天气"), registry=reg)
    def weather(args: WeatherArgs) -> str:
        return args.city

    assert reg.get("Forecast") is reg.get("天气") is reg.get("weather")
    assert reg.get("weather").aliases == ("forecast", "天气")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("alias", "name"),
    [("Calculator", "calculator"), ("Calculate", "calculator"), ("calc", "calculator"), ("math", "calculator"),
     ("Search", "search"), ("lookup", "search"), ("web_search", "search"), ("搜索", "search"),
     ("python_repl", "python"), ("py", "python"), ("code", "python")],
)  # fmt: skip
def test_builtin_aliases(alias, name):
    found = REGISTRY.get(alias)
    assert found is not None and found.name == name
    assert alias.lower() not in {n.lower() for n in REGISTRY.names()} - {name}


def test_the_engine_resolves_aliases_in_text_and_tools_mode():
    """A model's alias reaches the tool; the unknown-tool reply lists only real names."""
    run = Run(spec=RunSpec(question="q"))
    text = parse_text('Thought: 现在计算年龄\nAction: Calculator["2024 - 1982"]')
    tools_mode = parse_tool_reply(None, [ToolCallModel(id="c1", name="calc", arguments='{"expression": "6*7"}')])
    for turn, expression, result in ((text, "2024 - 1982", "42"), (tools_mode, "6*7", "42")):
        decision = decide(run, [], turn, REGISTRY, Limits())
        assert isinstance(decision, Act) and decision.rejected == []
        [planned] = decision.planned
        assert (planned.tool, planned.arguments) == ("calculator", {"expression": expression})
        calculator = REGISTRY.get(planned.tool)
        assert calculator is not None
        assert calculator.run(calculator.validate(planned.arguments)) == result
    unknown = decide(run, [], parse_text("Action: wikipedia[x]"), REGISTRY, Limits())
    assert isinstance(unknown, Act)
    [obs] = unknown.rejected
    assert obs.outcome == "unknown_tool"
    listed = obs.content.split("Available tools: ")[1].rstrip(".").split(", ")
    assert listed == REGISTRY.names() and "calc" not in listed and "lookup" not in listed


# --- the idempotent-tool cache, per tenant (real Redis, the in-process harness) -------------------


def test_one_tenants_cached_result_never_answers_another_tenant(make_harness: Any) -> None:
    """Tenant acme's search is computed afresh although tenant default's run cached the same call (a
    shared cache would tell acme what default searched for); default's next run gets its own entry."""
    from tests.harness import call, final
    from worker.store import keys

    harness = make_harness(tool_cache_ttl_s=60)
    lookup = call("search", {"query": "capital of France"})
    harness.llm.script(*[lookup, final("Paris")] * 3)
    first = harness.submit("What is the capital of France?", tenant="default")
    harness.drain()
    [entry] = harness.store.r.scan_iter(keys.tool_cache("default", "search", "*"))
    harness.store.r.set(entry, "what tenant default looked up", keepttl=True)  # marks default's entry

    other = harness.submit("What is the capital of France?", tenant="acme")
    harness.drain()
    again = harness.submit("What is the capital of France?", tenant="default")
    harness.drain()
    seen = {run: harness.steps(run)[0].observations[0] for run in (first, other, again)}
    assert [seen[r].outcome for r in (first, other, again)] == ["ok", "ok", "cached"]
    assert seen[other].content == seen[first].content  # acme's own result, computed ...
    assert seen[again].content == "what tenant default looked up"  # ... not default's entry
    assert len(list(harness.store.r.scan_iter(keys.tool_cache("acme", "search", "*")))) == 1


@pytest.mark.parametrize("mode", ["text", "tools"])
def test_a_run_calling_a_tool_by_alias_gets_its_result(make_harness: Any, mode: str) -> None:
    """The articles' `Calculator["2024 - 1982"]` (text mode) and `calc` (tools mode) run the calculator."""
    from tests.harness import call, final
    from worker.core.models import LLMReply

    harness = make_harness(mode=mode)
    if mode == "text":
        harness.llm.script(LLMReply(content='Thought: 现在计算年龄\nAction: Calculator["2024 - 1982"]'),
                           LLMReply(content="Thought: 42 岁\nFinal Answer: 42"))  # fmt: skip
    else:
        harness.llm.script(call("Calc", {"expression": "2024 - 1982"}), final("42"))
    run_id = harness.submit("How old is Chloé Zhao in 2024?")
    harness.drain()
    [first, _] = harness.steps(run_id)
    [obs] = first.observations
    assert (obs.tool, obs.outcome, obs.content) == ("calculator", "ok", "42")
    assert harness.run(run_id).answer == "42"


def test_a_plan_refuses_a_tool_called_by_its_alias_under_its_real_name() -> None:
    from worker.tenancy.plans import AllowedTools, load_plans

    free = AllowedTools(REGISTRY, load_plans()["free"])  # calculator and search, no python
    assert free.get("py") is None and free.get("calc") is REGISTRY.get("calculator")
    assert free.refusal("python_repl") == ("tool 'python' is not allowed on this tenant's plan ('free'); "
                                           "available tools: calculator, search")
