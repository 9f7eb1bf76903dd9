"""Search: an offline corpus (the one shipped in the package, or a team's JSONL file named by
REACTQ_SEARCH_CORPUS), SerpAPI when SERPAPI_API_KEY is set.

Terms are Unicode words for alphabetic scripts and overlapping character bigrams for CJK text (Chinese
has no spaces): "北京天气" -> 北京, 京天, 天气. Bigrams need no dictionary and find any word a segmenter
would, at the price of a few spurious pairs that BM25's idf weighs down (why not jieba:
docs/decisions/search-cjk.md)."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import httpx

from ..errors import ToolError

_log = logging.getLogger(__name__)

TOP_K = 3
SERPAPI_URL = "https://serpapi.com/search.json"
# CJK ideographs (with extension A and compatibility), kana and hangul: scripts written without spaces
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
_CJK_RUN = re.compile(rf"[{_CJK}]")
_STOP = frozenset(
    "a an the of in on at to for is are was were be what who whom which when where why how does do did "
    "and or by with from as it its that this these those".split()
)


def _terms(text: str) -> list[str]:
    """Search terms of `text`: lowercased words, and character bigrams of CJK runs (a lone
    character stays a unigram)."""
    terms: list[str] = []
    for token in _TOKEN.findall(text.lower()):
        if _CJK_RUN.match(token):
            terms.extend([token] if len(token) == 1 else [token[i:i + 2] for i in range(len(token) - 1)])
        elif token not in _STOP:
            terms.append(token)
    return terms


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


def CorpusFileError(message: str) -> ToolError:  # noqa: N802 - reads as the error it builds
    """REACTQ_SEARCH_CORPUS names a file that cannot be used; the message names the file and the line."""
    return ToolError(message, "search_corpus_invalid")


MAX_TITLE_CHARS = 500
MAX_TEXT_CHARS = 100_000


def load_corpus_file(path: str, max_bytes: int) -> list[dict[str, str]]:
    """The documents of a JSONL file, one `{"title": str, "text": str}` object a line (blank lines
    skipped). Anything else is a CorpusFileError naming the line: a knowledge base that half-loads
    would answer wrongly without saying so."""
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise CorpusFileError(f"search corpus {path}: cannot be read ({exc.strerror})") from None
    if size > max_bytes:
        raise CorpusFileError(f"search corpus {path}: {size} bytes, more than REACTQ_SEARCH_CORPUS_MAX_BYTES "
                              f"({max_bytes})")
    documents = []
    with open(path, encoding="utf-8", errors="strict") as fh:
        try:
            lines = fh.read().splitlines()
        except UnicodeDecodeError:
            raise CorpusFileError(f"search corpus {path}: not UTF-8 text") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusFileError(f"search corpus {path} line {number}: not JSON ({exc.msg})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("title"), str) or not isinstance(doc.get("text"), str):
            raise CorpusFileError(f'search corpus {path} line {number}: expected {{"title": str, "text": str}}')
        if set(doc) - {"title", "text"}:
            raise CorpusFileError(f"search corpus {path} line {number}: unknown field(s) "
                                  f"{sorted(set(doc) - {'title', 'text'})}")
        if not doc["text"].strip():
            raise CorpusFileError(f"search corpus {path} line {number}: empty text")
        if len(doc["title"]) > MAX_TITLE_CHARS or len(doc["text"]) > MAX_TEXT_CHARS:
            raise CorpusFileError(f"search corpus {path} line {number}: title over {MAX_TITLE_CHARS} or text "
                                  f"over {MAX_TEXT_CHARS} characters")
        documents.append({"title": doc["title"], "text": doc["text"]})
    if not documents:
        raise CorpusFileError(f"search corpus {path}: no documents")
    return documents


@lru_cache(maxsize=1)
def bundled_corpus() -> OfflineCorpus:
    raw = resources.files("worker.tools").joinpath("corpus.json").read_text(encoding="utf-8")
    return OfflineCorpus(json.loads(raw))


@lru_cache(maxsize=4)
def _file_corpus(path: str, max_bytes: int, mtime_ns: int) -> OfflineCorpus:
    return OfflineCorpus(load_corpus_file(path, max_bytes))


@dataclass(frozen=True)
class SearchSource:
    """Where the search tool looks: SerpAPI with this key (SERPAPI_API_KEY), else the corpus file
    (REACTQ_SEARCH_CORPUS), else the bundled corpus. The runtime sets it from the settings (`use_source`)."""

    serpapi_api_key: str | None = None
    corpus_path: str | None = None
    corpus_max_bytes: int = 64 * 1024 * 1024


_source = SearchSource()


def use_source(source: SearchSource) -> None:
    global _source
    _source = source


def current_source() -> SearchSource:
    return _source


def default_corpus(source: SearchSource) -> OfflineCorpus:
    """The corpus the source names (re-read when the file changes), else the bundled one.
    A bad file is logged in full for the operator; the model hears only that the knowledge base is
    unavailable (the file's path and contents are not its business)."""
    path = source.corpus_path
    if not path:
        return bundled_corpus()
    try:
        return _file_corpus(path, source.corpus_max_bytes, os.stat(path).st_mtime_ns)
    except (OSError, ToolError) as exc:
        detail = str(exc) if isinstance(exc, ToolError) else f"search corpus {path}: cannot be read ({exc.strerror})"
        _log.error("%s", detail)
        raise ToolError("the knowledge base is unavailable (the search corpus file is invalid; the operator "
                        "has been told why)", "search_corpus_invalid") from None


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
