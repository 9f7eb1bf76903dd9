"""What the stub knows without a tool, as a model knows common facts: greetings, a few translations and
word facts. The seed articles' eval sets keep such questions ("no tool needed") to check an agent answers
them directly instead of calling a tool for nothing."""

from __future__ import annotations

import re

_DIRECT: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.I), a) for p, a in (
    (r"^\s*(hi|hello|hey)\b[\s!.,]*(there)?[\s!.]*$", "Hello! How can I help you?"),
    (r"^\s*你好[\s!！。]*$", "你好！有什么可以帮你的吗？"),
    (r"\bsay hello in french\b", "Bonjour"),
    (r"\btranslate\s+[\"'“]?thank you[\"'”]?\s+(into|to)\s+spanish\b", "Gracias"),
    (r"\bopposite of hot\b", "The opposite of hot is cold."),
    (r"\bhow many days (are there )?in a week\b", "There are 7 days in a week."),
    (r"一周有几天|一个星期有几天", "一周有7天。"),
    (r"“?谢谢”?用英语怎么说", "Thank you"),
))


def direct_answer(question: str) -> str | None:
    """The answer to `question` if the stub knows it without a tool, else None."""
    for pattern, answer in _DIRECT:
        if pattern.search(question):
            return answer
    return None
