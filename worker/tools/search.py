"""Search: an offline corpus shipped in the package by default, SerpAPI when SERPAPI_API_KEY is set."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from functools import lru_cache
from importlib import resources

import httpx

from ..errors import ToolError

TOP_K = 3
SERPAPI_URL = "https://serpapi.com/search.json"
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    "a an the of in on at to for is are was were be what who whom which when where why how does do did "
    "and or by with from as it its that this these those".split()
)


def _terms(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


class OfflineCorpus:
    """BM25 over a list of {"title", "text"} documents."""

    def __init__(self, documents: list[dict[str, str]]) -> None:
        self.documents = documents
        self._doc_terms = [Counter(_terms(d["title"] + " " + d["title"] + " " + d["text"])) for d in documents]
        self._avg_len = sum(sum(c.values()) for c in self._doc_terms) / max(1, len(documents))
        df: Counter[str] = Counter()
        for counts in self._doc_terms:
            df.update(counts.keys())
        n = len(documents)
        self._idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def search(self, query: str, k: int = TOP_K) -> list[dict[str, str]]:
        terms = _terms(query)
        scored = []
        for doc, counts in zip(self.documents, self._doc_terms, strict=True):
            length = sum(counts.values())
            score = 0.0
            for t in terms:
                f = counts.get(t, 0)
                if f:
                    score += self._idf[t] * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * length / self._avg_len))
            if score > 0:
                scored.append((score, doc))
        scored.sort(key=lambda pair: -pair[0])
        return [doc for _, doc in scored[:k]]


@lru_cache(maxsize=1)
def default_corpus() -> OfflineCorpus:
    raw = resources.files("worker.tools").joinpath("corpus.json").read_text(encoding="utf-8")
    return OfflineCorpus(json.loads(raw))


def serpapi_search(query: str, api_key: str, client: httpx.Client, url: str = SERPAPI_URL) -> list[dict[str, str]]:
    """Web results from SerpAPI's Google engine, as title/text pairs."""
    try:
        response = client.get(url, params={"q": query, "api_key": api_key, "engine": "google", "num": TOP_K})
    except httpx.HTTPError as exc:
        raise ToolError(f"web search unavailable: {exc.__class__.__name__}", "search_unavailable") from None
    if response.status_code != 200:
        raise ToolError(f"web search failed with HTTP {response.status_code}", "search_http_error")
    try:
        payload = response.json()
    except ValueError:
        raise ToolError("web search returned an unreadable response", "search_bad_response") from None
    results = []
    if answer := payload.get("answer_box", {}).get("answer"):
        results.append({"title": "Answer", "text": str(answer)})
    for item in payload.get("organic_results", []):
        results.append({"title": str(item.get("title", "")), "text": str(item.get("snippet", ""))})
    return results[:TOP_K]


def format_results(query: str, results: list[dict[str, str]]) -> str:
    if not results:
        return f"No results for {query!r}."
    return "\n".join(f"{i}. {r['title']}: {r['text']}" for i, r in enumerate(results, 1))
