"""Categories of evaluation lines (pure): the name rule, the category a results line counts under, and a
bounded set of per-category accumulators.

An evaluation line may carry `"category"` (1 to 40 letters, digits, `_` or `-`); a line without one
counts under UNCATEGORISED. Per-category figures keep memory bounded in the number of categories, not
only in the number of lines: at most MAX_CATEGORIES are kept apart, and the lines of any further
category are pooled under OTHER (which is one of the MAX_CATEGORIES)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator

__all__ = ["BUNDLED_CATEGORIES", "MAX_CATEGORIES", "MAX_CATEGORY_CHARS", "OTHER", "UNCATEGORISED", "Buckets",
           "Category", "category_of", "check_category"]

# What the bundled set (worker/data/eval_set.jsonl) covers, after the second seed article's list:
# questions needing no tool, one tool call, several, recovery after a tool failure, dependent multi-step
# reasoning (observation n decides action n+1), and Chinese questions.
BUNDLED_CATEGORIES = ("no_tool", "single_tool", "multi_tool", "recovery", "dependent", "chinese")
UNCATEGORISED = "uncategorised"
OTHER = "other"
MAX_CATEGORIES = 50
MAX_CATEGORY_CHARS = 40
_NAME = re.compile(r"[A-Za-z0-9_-]+")


def check_category(value: str) -> str:
    """`value` if it is a good category name; ValueError naming the rule otherwise."""
    if not (0 < len(value) <= MAX_CATEGORY_CHARS and _NAME.fullmatch(value)):
        raise ValueError(f"a category is 1 to {MAX_CATEGORY_CHARS} letters, digits, '_' or '-'")
    return value


Category = Annotated[str, AfterValidator(check_category)]  # the `category` field of an evaluation line


def category_of(line: dict[str, Any]) -> str:
    """The category a results line counts under (a results file is read back as it is: a value that
    breaks the name rule counts as UNCATEGORISED)."""
    value = line.get("category")
    if isinstance(value, str) and 0 < len(value) <= MAX_CATEGORY_CHARS and _NAME.fullmatch(value):
        return value
    return UNCATEGORISED


T = TypeVar("T")


class Buckets(Generic[T]):
    """One accumulator per category, made by `make` on first use, in order of first appearance: at most
    `limit` of them, the last being OTHER for every category past the first `limit - 1`."""

    def __init__(self, make: Callable[[], T], limit: int = MAX_CATEGORIES) -> None:
        if limit < 2:
            raise ValueError("limit must leave room for one category and OTHER")
        self._make = make
        self._limit = limit
        self._items: dict[str, T] = {}

    def get(self, name: str) -> T:
        if name not in self._items:
            if len(self._items) >= self._limit - (OTHER not in self._items):
                name = OTHER
            if name not in self._items:
                self._items[name] = self._make()
        return self._items[name]

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(self._items.items())

    def __len__(self) -> int:
        return len(self._items)
