"""Dependent questions: each action is built from the previous observation, not from the question (pure).

"How old was the director of Nomadland in 2024?" is a chain of hops: search the director of Nomadland,
read the name in the observation (Chloé Zhao), search *her* birth year, read the year (1982), then
compute 2024 - 1982. A hop whose observation is an error or does not hold what it needs is tried once
more with a rephrased query, as the articles' Search["Nomadland film director"] after a timeout.
English and Chinese questions ("找出2021年奥斯卡最佳影片的导演的出生年份，并计算他到2024年的年龄").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Chain", "Compare", "Step", "parse_chain", "next_step", "extract"]

# the order hops are applied in: a film before its director, a company before its CEO, a person before
# their mother, anyone before their birth year
ORDER = ("best_picture", "ceo", "director", "mother", "birth_year")

_EN_RELATIONS = {
    "best_picture": re.compile(r"best picture", re.I),
    "ceo": re.compile(r"\bCEO\b|chief executive", re.I),
    "director": re.compile(r"\bdirector\b|\bdirected\b", re.I),
    "mother": re.compile(r"\bmother\b|\bmom\b|\bmum\b", re.I),
    "birth_year": re.compile(r"\bborn\b|\bbirth ?year\b", re.I),
}
_ZH_RELATIONS = {
    "best_picture": re.compile(r"最佳影片"),
    "ceo": re.compile(r"CEO|首席执行官|总裁", re.I),
    "director": re.compile(r"导演|执导"),
    "mother": re.compile(r"妈妈|母亲"),
    "birth_year": re.compile(r"出生"),
}
_CJK = re.compile(r"[\u4e00-\u9fff]")
_YEAR = r"((?:1[89]|20)\d\d)"

QUERIES = {
    "en": {"best_picture": ("{x} Oscars Best Picture winner", "Best Picture winner Academy Awards {x}"),
           "director": ("{x} director", "{x} film director"),
           "ceo": ("{x} CEO", "CEO of {x}"),
           "mother": ("{x} mother", "mother of {x}"),
           "birth_year": ("{x} birth year", "{x} born")},
    "zh": {"best_picture": ("{x}年奥斯卡最佳影片", "{x}年奥斯卡金像奖最佳影片"),
           "director": ("{x}的导演", "电影{x}导演"),
           "ceo": ("{x} CEO", "{x}首席执行官"),
           "mother": ("{x}的母亲", "{x}的妈妈"),
           "birth_year": ("{x}出生年份", "{x}哪年出生")},
}


@dataclass(frozen=True)
class Chain:
    """A dependent question: a starting entity, the hops from it, and the year to compute an age at."""

    lang: str  # "en" | "zh"
    base: str
    hops: tuple[str, ...]
    age_at: int | None  # None: no age asked


@dataclass(frozen=True)
class Compare:
    """Two places' values of one quantity, then their difference ("北京和上海的年平均气温相差多少度？"):
    the subtraction is written from the two observed numbers, the larger first."""

    lang: str
    first: str
    second: str
    quantity: str


@dataclass(frozen=True)
class Step:
    """What to do next: a tool call (with its thought), or the final answer."""

    tool: str | None
    argument: str
    thought: str


# --- reading the question ------------------------------------------------------------

def _age_year(question: str, this_year: int, lang: str) -> int | None:
    if lang == "en":
        if not re.search(r"\bhow old\b|\bage\b", question, re.I):
            return None
        found = re.search(r"\b(?:in|by|at|of)\s+" + _YEAR + r"\b", question)
        return int(found[1]) if found else this_year
    if not re.search(r"年龄|年纪|多大|几岁|多少岁", question):
        return None
    found = re.search(r"到\s*" + _YEAR + r"\s*年|" + _YEAR + r"\s*年(?:时|的年龄|的年纪|多大|几岁)", question)
    if found:
        return int(found[1] or found[2])
    return this_year


def _en_base(question: str, hops: Sequence[str]) -> str | None:
    if "best_picture" in hops:
        found = re.search(_YEAR + r"(?:'s)?\s+(?:oscars?|academy awards?)?\s*best picture", question, re.I) or \
            re.search(r"best picture[^?.]*?" + _YEAR, question, re.I)
        return found[1] if found else None
    text = re.split(r"\s+(?:in|by|at)\s+(?:1[89]|20)\d\d\b|\s+(?:this year|now|today)\b|[?,;]", question)[0]
    if " of " in text:
        base = re.split(r"\s+of\s+(?:the\s+)?", text)[-1]
    else:
        base = re.sub(r"^.*?\bhow old\s+(?:is|was|will)\s+(?:the\s+)?|^.*?\bwhen was\s+|\s+born$", "", text,
                      flags=re.I)
    base = base.strip(" \"'")
    return base if base and len(base) <= 80 else None


def _zh_base(question: str, hops: Sequence[str]) -> str | None:
    if "best_picture" in hops:
        found = re.search(_YEAR + r"\s*年?\s*(?:第\s*\d+\s*届)?\s*(?:奥斯卡|学院奖)", question)
        return found[1] if found else None
    first = min((m.start() for r in _ZH_RELATIONS.values() for m in [r.search(question)] if m),
                default=None)
    age = re.search(r"到\s*\d{4}|今年|现在|\d{4}\s*年|多大|几岁|多少岁|年龄|年纪", question)
    cut = min(x for x in (first, age.start() if age else None, len(question)) if x is not None)
    base = re.sub(r"^(?:请问|请|找出|查一下|告诉我|帮我查|计算)", "", question[:cut]).strip()
    base = base.strip("《》“”\"' 的，,")
    return base if base and len(base) <= 40 else None


_ZH_COMPARE = re.compile(r"^(?:请问|对比一下|比较一下|对比|比较)?\s*([\u4e00-\u9fff]{2,8}?)(?:和|与|跟)"
                         r"([\u4e00-\u9fff]{2,8}?)的"
                         r"([\u4e00-\u9fff]{2,10}?)(?:相差|差|之差|的差)")
_EN_COMPARE = re.compile(r"difference between the (.+?) (?:of|in) ([A-Z]\w+) and (?:of |in )?([A-Z]\w+)", re.I)


def parse_chain(question: str, this_year: int) -> Chain | Compare | None:
    """The chain a dependent question asks for, or None when it is not one (two dependent steps at least:
    one hop and an age, or two hops; or a comparison of two looked-up values)."""
    if found := _ZH_COMPARE.search(question):
        return Compare("zh", found[1], found[2], found[3])
    if found := _EN_COMPARE.search(question):
        return Compare("en", found[2], found[3], found[1])
    lang = "zh" if _CJK.search(question) else "en"
    relations = _ZH_RELATIONS if lang == "zh" else _EN_RELATIONS
    hops = [h for h in ORDER if relations[h].search(question)]
    age_at = _age_year(question, this_year, lang)
    if age_at is not None and "birth_year" not in hops:
        hops.append("birth_year")
    if len(hops) + (age_at is not None) < 2 or hops == ["birth_year"] and age_at is None:
        return None
    if lang == "en" and hops[0] != "best_picture" and not re.search(r"\bhow old\b|\bwhen was\b|\bwho\b", question,
                                                                     re.I):
        return None
    base = (_zh_base if lang == "zh" else _en_base)(question, hops)
    if base is None:
        return None
    return Chain(lang, base, tuple(hops), age_at)


# --- reading observations ------------------------------------------------------------

_NAME = r"([A-Z][\w'-]*(?:[ -][A-Z][\w'-]*){0,3})"
_ZH_NAME = r"([^\s，。；、,;（(）)“”《》的是为]{2,12})"
_EXTRACT = {
    "best_picture": [re.compile(r"^\s*(?:\d+\.\s*[^:\n]*:\s*)?" + _NAME + r" won (?:the )?Best Picture", re.M),
                     re.compile(r"Best Picture[^.\n]*?(?:was|:)\s*\"?" + _NAME),
                     re.compile(r"《([^》]{1,30})》[^。\n]*最佳影片"),
                     re.compile(r"最佳影片(?:奖)?(?:是|为|：|:)\s*《?([^》，。\s]{1,30})")],
    "director": [re.compile(r"directed by " + _NAME), re.compile(r"[Dd]irector(?:\s+is|:)\s+" + _NAME),
                 re.compile(r"导演(?:是|为|：|:)\s*" + _ZH_NAME), re.compile(r"由" + _ZH_NAME + r"执导")],
    "ceo": [re.compile(r"CEO(?: of [A-Z]\w*)? is " + _NAME), re.compile(_NAME + r" is the CEO"),
            re.compile(r"(?:CEO|首席执行官)(?:（CEO）|\(CEO\))?(?:是|为)\s*" + _ZH_NAME)],
    "mother": [re.compile(r"[Mm]other (?:is|was) " + _NAME), re.compile(r"母亲(?:是|为)\s*" + _ZH_NAME)],
}
_BORN = [re.compile(r"\b(?:born|birth year)\b[^.\n]*?" + _YEAR), re.compile(_YEAR + r"\s*年[^。，\n]{0,12}出生"),
         re.compile(r"出生(?:于|在)?[^。\n\d]{0,12}" + _YEAR)]
_TITLE = re.compile(r"^\s*\d+\.\s*[^:\n]{1,200}:")
_ERROR = re.compile(r"^\s*(?:error|no results|exit code|timed out|timeout|invalid|unknown tool)\b", re.I)


def extract(hop: str, observation: str, entity: str, lang: str = "en") -> str | None:
    """What `hop` needs from a search observation (a name, a film, a year), or None. A Chinese chain
    reads Chinese statements first (the results may hold both)."""
    if _ERROR.search(observation):
        return None
    if hop == "birth_year":  # the entity's own year: the result titled with it first, then lines naming it
        key = entity.lower()
        lines = [line for line in observation.splitlines() if line.strip()]
        titled = [line for line in lines if key in (_TITLE.match(line) or [""])[0].lower()]
        named = [line for line in lines if key in line.lower() and line not in titled]
        for line in titled + named or lines:
            for pattern in _BORN:
                found = pattern.search(line)
                if found:
                    return found[1]
        return None
    patterns = sorted(_EXTRACT[hop], key=lambda p: (lang == "zh") != bool(_CJK.search(p.pattern)))
    for pattern in patterns:
        found = pattern.search(observation)
        if found and found[1].strip().lower() != entity.lower():
            return found[1].strip()
    return None


# --- deciding --------------------------------------------------------------------------

_DESCRIBE = {"en": {"best_picture": "the Best Picture winner", "director": "the director", "ceo": "the CEO",
                    "mother": "the mother", "birth_year": "the birth year"},
             "zh": {"best_picture": "最佳影片", "director": "导演", "ceo": "CEO", "mother": "母亲",
                    "birth_year": "出生年份"}}


def _thought(chain: Chain, hop: str, subject: str, found: list[tuple[str, str]], attempt: int) -> str:
    zh = chain.lang == "zh"
    what = _DESCRIBE[chain.lang][hop]
    if hop == "best_picture":
        subject = f"{subject}年奥斯卡" if zh else f"the {subject} Oscars"
    if attempt:
        return (f"上一次搜索没有得到{subject}的{what}，我换一个说法再搜索。" if zh else
                f"The last search did not give {what} of {subject}; I will rephrase the query and retry.")
    if not found:
        return (f"我需要先找到{subject}的{what}，使用搜索工具。" if zh else
                f"First I need {what} of {subject}, so I will search for it.")
    prev_hop, prev = found[-1]
    return (f"根据上一步的观察，{_DESCRIBE['zh'][prev_hop]}是{prev}。接下来我需要{prev}的{what}。" if zh else
            f"The observation says {_DESCRIBE['en'][prev_hop]} is {prev}. Next I need {what} of {prev}.")


def _answer(chain: Chain, found: list[tuple[str, str]], age: str | None) -> str:
    zh = chain.lang == "zh"
    facts = []
    subject = chain.base
    for hop, value in found:
        if hop == "best_picture":
            facts.append(f"{subject}年奥斯卡最佳影片是《{value}》" if zh else
                         f"the {subject} Best Picture winner is {value}")
        elif hop == "birth_year":
            facts.append(f"{subject}出生于{value}年" if zh else f"{subject} was born in {value}")
        else:
            facts.append(f"{subject}的{_DESCRIBE['zh'][hop]}是{value}" if zh else
                         f"{_DESCRIBE['en'][hop]} of {subject} is {value}")
        subject = value if hop != "birth_year" else subject
    if age is not None:
        facts.append(f"到{chain.age_at}年是{age}岁" if zh else f"in {chain.age_at} {subject} is {age} years old")
    text = ("，".join(facts) + "。") if zh else ("; ".join(facts) + ".")
    return text if zh else text[0].upper() + text[1:]


def _failed(chain: Chain, hop: str, subject: str, found: list[tuple[str, str]]) -> Step:
    what = _DESCRIBE[chain.lang][hop]
    known = _answer(chain, found, None) if found else ""
    if chain.lang == "zh":
        return Step(None, f"{known}但我没有找到{subject}的{what}。", "搜索两次都没有结果。")
    return Step(None, f"{known} I could not find {what} of {subject}.".strip(), "Two searches gave nothing usable.")


def _value_of(quantity: str, entity: str, observation: str) -> str | None:
    """The number stated for `quantity` in the lines naming `entity`."""
    if _ERROR.search(observation):
        return None
    lines = [line for line in observation.splitlines() if entity.lower() in line.lower()]
    for line in lines:
        at = line.lower().find(quantity.lower())
        if at >= 0 and (number := re.search(r"-?\d+(?:\.\d+)?", line[at + len(quantity):])):
            rest = line[at + len(quantity) + number.end():]
            unit = re.match(r"\s*(摄氏度|°C|度|%|亿元|万人|米|km|kilometres|metres)?", rest)
            return number[0] + (unit[1] or "" if unit else "")
    return None


def _number(value: str) -> str:
    return re.match(r"-?\d+(?:\.\d+)?", value)[0]  # type: ignore[index]  # _value_of starts with one


def _compare_step(cmp: Compare, observations: Sequence[str]) -> Step:
    zh = cmp.lang == "zh"
    values: list[str] = []
    for place in (cmp.first, cmp.second):
        pos = len(values)
        query = f"{place}{cmp.quantity}" if zh else f"{place} {cmp.quantity}"
        if pos >= len(observations):
            thought = (f"我需要查到{place}的{cmp.quantity}，使用搜索工具。" if zh else
                       f"I need the {cmp.quantity} of {place}; I will search for it.")
            return Step("search", query, thought)
        value = _value_of(cmp.quantity, place, observations[pos])
        if value is None:
            return Step(None, f"我没有找到{place}的{cmp.quantity}。" if zh else
                        f"I could not find the {cmp.quantity} of {place}.", "The search gave no number.")
        values.append(value)
    (high_place, high), (low_place, low) = sorted(zip((cmp.first, cmp.second), values, strict=True),
                                                  key=lambda pair: -float(_number(pair[1])))
    unit = values[0][len(_number(values[0])):]
    if len(observations) < 3:
        thought = (f"{cmp.first}是{values[0]}，{cmp.second}是{values[1]}，我用计算器算出两者的差。" if zh else
                   f"{cmp.first} has {values[0]} and {cmp.second} {values[1]}; I will compute the difference.")
        return Step("calculator", f"{_number(high)} - {_number(low)}", thought)
    result = observations[2].strip().splitlines()[0] if observations[2].strip() else ""
    if zh:
        return Step(None, f"{cmp.first}的{cmp.quantity}是{values[0]}，{cmp.second}的是{values[1]}，"
                          f"{high_place}比{low_place}高{result}{unit}。", "I now know the final answer.")
    return Step(None, f"The {cmp.quantity} of {cmp.first} is {values[0]} and of {cmp.second} {values[1]}: "
                      f"{high_place} is higher by {result}{unit and ' ' + unit}.", "I now know the final answer.")


def next_step(chain: Chain | Compare, observations: Sequence[str]) -> Step:
    """The next action of the chain given the observations so far, in order (each one answers the call
    made before it), or the final answer."""
    if isinstance(chain, Compare):
        return _compare_step(chain, observations)
    found: list[tuple[str, str]] = []
    subject = chain.base
    pos = 0
    for hop in chain.hops:
        value = None
        for attempt in range(2):
            query = QUERIES[chain.lang][hop][attempt].format(x=subject)
            if pos >= len(observations):
                return Step("search", query, _thought(chain, hop, subject, found, attempt))
            value = extract(hop, observations[pos], subject, chain.lang)
            pos += 1
            if value is not None:
                break
        if value is None:
            return _failed(chain, hop, subject, found)
        found.append((hop, value))
        if hop != "birth_year":
            subject = value
    if chain.age_at is None:
        return Step(None, _answer(chain, found, None), "I have everything I need.")
    birth = found[-1][1]
    expression = f"{chain.age_at} - {birth}"
    if pos >= len(observations):
        thought = (f"{subject}出生于{birth}年，我用计算器算出到{chain.age_at}年的年龄。" if chain.lang == "zh" else
                   f"{subject} was born in {birth}; I will compute the age in {chain.age_at} with the calculator.")
        return Step("calculator", expression, thought)
    result = observations[pos].strip().splitlines()[0] if observations[pos].strip() else ""
    if not re.fullmatch(r"-?\d+(?:\.0+)?", result):
        return Step(None, _answer(chain, found, None) + f" ({expression}: {result or 'no result'})",
                    "The calculator did not give a number.")
    return Step(None, _answer(chain, found, str(int(float(result)))), "I now know the final answer.")
