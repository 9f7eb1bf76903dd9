"""Chinese questions: their parts, their tool calls and their answers (pure).

"半径为5的圆的面积是多少？" -> calculator `pi * 5 ** 2`; "2024年北京的GDP是多少？" -> search `2024年北京GDP`;
an answer is the observation's sentence sharing most character bigrams with the question, or the
computed value rounded as asked ("保留两位小数").
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["has_cjk", "split_parts", "expression", "search_query", "answer", "decimals", "number_answer"]

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_NUM = r"(\d+(?:\.\d+)?)"


def has_cjk(text: str) -> bool:
    return bool(_CJK.search(text))


def split_parts(question: str) -> list[str]:
    """Sub-questions: split at ？ and ；, and at "，以及"/"，还有" (a comma alone often joins one question)."""
    parts = [p.strip(" 。.!！") for p in re.split(r"[？?；;]\s*|[，,]\s*(?:以及|还有|另外)", question.strip())]
    merged: list[str] = []
    for part in filter(None, parts):
        if merged and re.match(r"^(?:请)?保留", part):  # "保留两位小数" belongs to the question before it
            merged[-1] += "，" + part
        else:
            merged.append(part)
    return merged


_SHAPES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    (re.compile(r"半径(?:为|是|=|：)?\s*" + _NUM + r"[^，。？的]*的?圆的?面积"), lambda m: f"pi * {m[1]} ** 2"),
    (re.compile(r"圆的?半径(?:为|是|=)?\s*" + _NUM + r".*面积"), lambda m: f"pi * {m[1]} ** 2"),
    (re.compile(r"半径(?:为|是|=|：)?\s*" + _NUM + r"[^，。？的]*的?圆的?周长"), lambda m: f"2 * pi * {m[1]}"),
    (re.compile(r"球(?:体)?的?半径(?:为|是|=)?\s*" + _NUM + r".*体积"), lambda m: f"4 / 3 * pi * {m[1]} ** 3"),
    (re.compile(r"半径(?:为|是|=)?\s*" + _NUM + r"[^，。？]*球(?:体)?的?体积"), lambda m: f"4 / 3 * pi * {m[1]} ** 3"),
    (re.compile(r"球(?:体)?的?半径(?:为|是|=)?\s*" + _NUM + r".*表面积"), lambda m: f"4 * pi * {m[1]} ** 2"),
]
_ZH_OPS = [(r"的平方根", "__SQRT__"), (r"加上?", " + "), (r"减去?", " - "), (r"乘以?", " * "), (r"除以", " / "),
           (r"的平方", " ** 2"), (r"的立方", " ** 3"), (r"的(\d+)次方", r" ** \1")]


def expression(part: str) -> str | None:
    """A calculator expression for a Chinese arithmetic or geometry question, or None."""
    for pattern, build in _SHAPES:
        found = pattern.search(part)
        if found:
            return build(found)
    text = re.sub(r"^(?:请|帮我)?(?:计算|算一下|算算|求)\s*[:：]?", "", part.strip())
    text = re.sub(r"(?:等于|是)?多少|等于几|的结果|的值|[=＝]\s*$|保留.*$", "", text).strip(" ？?，,。")
    for word, repl in _ZH_OPS:
        text = re.sub(word, repl, text)
    text = re.sub(r"(\d+(?:\.\d+)?)\s*__SQRT__", r"sqrt(\1)", text)
    if not text or has_cjk(text) or not re.search(r"\d", text):
        return None
    return text.strip()


_FILLER = re.compile(r"^(?:请问|请|帮我查一下|帮我|查一下|告诉我|你知道)|(?:是多少|是什么|是谁|是哪里|是哪个|有多少|"
                     r"怎么样|如何|吗|呢|呀)+$")


def search_query(part: str) -> str | None:
    """Keywords for a Chinese factual question ("2024年北京的GDP是多少" -> "2024年北京GDP")."""
    text = part.strip(" ？?。!！")
    for _ in range(2):
        text = _FILLER.sub("", text).strip()
    text = text.replace("的", "")
    return text or None


def decimals(question: str) -> int | None:
    """How many decimals the question asks for ("保留两位小数" -> 2), or None."""
    found = re.search(r"保留\s*([0-9一二两三四五])\s*位小数", question)
    if not found:
        return None
    return int(found[1]) if found[1].isdigit() else {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5}[found[1]]


def number_answer(part: str, value: str) -> str:
    """A computed value as an answer: rounded as asked, else to two decimals if it has more."""
    try:
        number = float(value.replace(",", ""))
    except ValueError:
        return value
    subject = re.sub(r"(?:是|等于|为)?(?:多少|几)[^，。]*$", "", re.sub(r"[，,]\s*(?:请)?保留.*$", "", part))
    subject = re.sub(r"^(?:请|帮我)?(?:计算|算一下|求)\s*[:：]?\s*", "", subject)
    places = decimals(part)
    if places is None:
        if number == int(number):
            return f"{subject}为{value}"
        return f"{subject}约为{number:.2f}（{value}）"
    return f"{subject}约为{number:.{places}f}"


def _bigrams(text: str) -> set[str]:
    runs = re.findall(r"[\u3400-\u9fff]+|[A-Za-z0-9.]+", text)
    grams: set[str] = set()
    for run in runs:
        if _CJK.match(run):
            grams |= {run[i:i + 2] for i in range(len(run) - 1)} or {run}
        else:
            grams.add(run.lower())
    return grams


def answer(part: str, observation: str) -> str | None:
    """The sentence of a search observation that shares most with the question (earlier wins ties)."""
    wanted = _bigrams(part)
    best: tuple[int, str] | None = None
    for line in observation.splitlines():
        text = re.sub(r"^\s*\d+\.\s*[^:\n]{1,200}:\s+", "", line)
        for sentence in re.split(r"(?<=[。！？])|(?<=\.)\s+", text):
            sentence = sentence.strip()
            if not sentence:
                continue
            score = len(wanted & _bigrams(sentence))
            if best is None or score > best[0]:
                best = (score, sentence)
    return best[1] if best and best[0] > 0 else None
