"""Chinese search terms: character bigrams (what worker/tools/search.py does) against jieba's words.

For each of the seed articles' Chinese questions (and the stub's hop queries) it checks that the document
holding the answer ranks first in the bundled corpus, and measures the cost of tokenising a query, the
import time and the memory of each way. jieba is optional (`pip install jieba`); without it only
bigrams are measured.

    python3 bench/search_cjk.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.tools import search  # noqa: E402

# (query, the title of the document that answers it)
CASES = [
    ("2024年北京的GDP是多少？", "2024年北京GDP"),
    ("2024年北京GDP", "2024年北京GDP"),
    ("2024年中国的GDP增长率是多少？", "2024年中国GDP"),
    ("北京的年平均气温是多少", "北京气候"),
    ("上海的气候怎么样", "上海气候"),
    ("今天北京的天气怎么样", "北京气候"),
    ("中国的首都是哪里", "北京"),
    ("特斯拉的CEO是谁", "特斯拉"),
    ("埃隆·马斯克的母亲是谁", "埃隆·马斯克"),
    ("梅耶·马斯克出生年份", "梅耶·马斯克"),
    ("梅耶·马斯克是哪一年出生的", "梅耶·马斯克"),
    ("2021年奥斯卡最佳影片", "无依之地"),
    ("无依之地的导演是谁", "无依之地"),
    ("赵婷出生年份", "赵婷"),
    ("赵婷是哪年出生的", "赵婷"),
    ("马斯克的妈妈", "埃隆·马斯克"),
]


def hit_rate(terms) -> float:  # noqa: ANN001 - a tokenizer function
    original = search._terms
    search._terms = terms
    try:
        corpus = search.OfflineCorpus(search.bundled_corpus().documents)
        hits = [bool(r := corpus.search(q)) and r[0]["title"] == t for q, t in CASES]
    finally:
        search._terms = original
    for (query, title), hit in zip(CASES, hits, strict=True):
        if not hit:
            print(f"    miss: {query} (wanted {title})")
    return sum(hits) / len(hits)


def per_query_us(terms) -> float:  # noqa: ANN001
    queries = [q for q, _ in CASES] * 200
    started = time.perf_counter()
    for q in queries:
        terms(q)
    return (time.perf_counter() - started) / len(queries) * 1e6


def import_cost(code: str) -> tuple[float, int]:
    """Seconds and resident memory (KiB, VmHWM: ru_maxrss would carry the parent's across exec) of a fresh
    interpreter running `code`, less a bare interpreter's."""
    def run(snippet: str) -> tuple[float, int]:
        probe = (f"import re, time; t = time.perf_counter(); {snippet}; s = time.perf_counter() - t; "
                 "print(s, re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1])")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
        seconds, rss = out.split()
        return float(seconds), int(rss)
    base = run("pass")
    seconds, rss = run(code)
    return seconds, rss - base[1]  # KiB


def main() -> None:
    print(f"{len(CASES)} Chinese queries against {len(search.bundled_corpus().documents)} documents")
    print("bigrams:")
    rate = hit_rate(search._terms)
    print(f"  hit@1 {rate:.0%}, {per_query_us(search._terms):.1f} µs a query, extra import/memory: none")
    try:
        import jieba
    except ImportError:
        print("jieba: not installed")
        return
    jieba.setLogLevel(60)
    jieba.initialize()

    def jieba_terms(text: str) -> list[str]:
        words = []
        for word in jieba.lcut_for_search(text.lower()):
            word = word.strip()
            if word and (word.isalnum() or search._CJK_RUN.match(word)) and word not in search._STOP:
                words.append(word)
        return words

    print("jieba (lcut_for_search):")
    rate = hit_rate(jieba_terms)
    seconds, rss = import_cost("import jieba; jieba.setLogLevel(60); jieba.initialize(); jieba.lcut('北京')")
    print(f"  hit@1 {rate:.0%}, {per_query_us(jieba_terms):.1f} µs a query, import + dictionary "
          f"{seconds:.2f} s, +{rss / 1024:.0f} MiB resident")


if __name__ == "__main__":
    main()
