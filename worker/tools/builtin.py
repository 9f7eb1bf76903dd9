"""The built-in tools: calculator, search, python."""

from __future__ import annotations

from functools import lru_cache

import httpx
from pydantic import BaseModel, Field

from ..errors import ToolError
from . import calculator as calc
from . import search as web
from .registry import tool


class CalculatorArgs(BaseModel):
    expression: str = Field(description="arithmetic expression, e.g. (17 + 25) * 3 or sqrt(1764)",
                            examples=["(17 + 25) * 3"])


class SearchArgs(BaseModel):
    query: str = Field(min_length=1, max_length=500, description="keywords to look up",
                       examples=["Nomadland director"])


class PythonArgs(BaseModel):
    code: str = Field(min_length=1, max_length=50_000, description="Python 3 code; print() the result",
                      examples=["print(sum(range(10)))"])


# Not cached: evaluating takes microseconds, less than the cache's Redis lookup and write would. A thread
# is enough: every expression is bounded before it is computed (calculator.py), so it finishes in
# milliseconds; a process would cost a round trip per call for nothing.
@tool("calculator", CalculatorArgs, "Evaluate arithmetic and math functions exactly.", idempotent=True,
      cached=False, aliases=("calc", "calculate", "math", "计算器", "计算"),
      returns="the exact result as a number, or an error naming what is wrong",
      when="for any arithmetic: never compute a number in your head")
def calculator(args: CalculatorArgs) -> str:
    return calc.format_number(calc.evaluate(args.expression))


@lru_cache(maxsize=1)
def _http_client() -> httpx.Client:
    return httpx.Client(timeout=10.0)


@tool("search", SearchArgs, "Look up facts in the knowledge base / on the web.", idempotent=True,
      aliases=("lookup", "web_search", "google", "搜索"),
      returns="the best matching passages, one per line, or No results",
      when="for facts you do not know for sure, recent events, names, dates; use short keywords")
def search(args: SearchArgs) -> str:
    source = web.current_source()
    key = source.serpapi_api_key
    results = (
        web.serpapi_search(args.query, key, _http_client()) if key else web.default_corpus(source).search(args.query)
    )
    return web.format_results(args.query, results)


@tool("python", PythonArgs, "Run Python 3 code in a sandbox and return what it prints.", sandboxed=True,
      aliases=("python_repl", "python3", "py", "code", "code_interpreter", "代码"),
      returns="what the program printed (stdout), and its error if it failed",
      when="for computations too long for one expression: loops, dates, lists, data")
def python(args: PythonArgs) -> str:  # pragma: no cover - sandboxed tools never run inline
    raise ToolError("python runs in the sandbox", "not_inline")
