"""The offline search on Chinese text (character bigrams) and on a team's own corpus file
(REACTQ_SEARCH_CORPUS): tokenising, ranking, validation of the file, the tool's answer."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from worker.config import Settings
from worker.errors import ToolError
from worker.tools import search as web
from worker.tools.builtin import SearchArgs
from worker.tools.builtin import search as search_tool
from worker.tools.search import (
    OfflineCorpus,
    SearchSource,
    _terms,
    bundled_corpus,
    current_source,
    load_corpus_file,
    use_source,
)


def test_terms_of_chinese_text_are_character_bigrams() -> None:
    assert _terms("北京天气") == ["北京", "京天", "天气"]
    assert _terms("2024年北京GDP") == ["2024", "年北", "北京", "gdp"]
    assert _terms("京") == ["京"]  # a lone character stays a unigram
    assert _terms("The capital of France") == ["capital", "france"]  # stop words dropped, as before
    assert _terms("Chloé Zhao") == ["chloé", "zhao"]  # accented letters stay in their word
    assert _terms("梅耶·马斯克") == ["梅耶", "马斯", "斯克"]  # the middle dot separates runs
    assert _terms("東京タワー") == ["東京", "京タ", "タワ", "ワー"]  # kana are CJK too


@pytest.mark.parametrize(("query", "title"), [
    ("2024年北京GDP", "2024年北京GDP"),
    ("2024年中国GDP增长率", "2024年中国GDP"),
    ("北京年平均气温", "北京气候"),
    ("上海年平均气温", "上海气候"),
    ("赵婷出生年份", "赵婷"),
    ("梅耶·马斯克出生年份", "梅耶·马斯克"),
    ("特斯拉 CEO", "特斯拉"),
    ("2021年奥斯卡最佳影片", "无依之地"),
    ("Chloé Zhao birth year", "Chloé Zhao"),
    ("2021 Oscars Best Picture winner", "Nomadland"),
])
def test_the_articles_questions_find_their_document_first(query: str, title: str) -> None:
    assert bundled_corpus().search(query)[0]["title"] == title


def test_chinese_query_used_to_find_nothing_and_now_ranks() -> None:
    corpus = OfflineCorpus([{"title": "上海", "text": "上海是中国的经济中心。"},
                            {"title": "北京", "text": "北京是中国的首都。"}])
    assert [d["title"] for d in corpus.search("中国的首都是哪里")] == ["北京", "上海"]
    assert corpus.search("东京") == []


@pytest.fixture
def use_corpus() -> Iterator[Callable[..., None]]:
    """Point the search tool at a corpus file, as the runtime does from REACTQ_SEARCH_CORPUS."""
    yield lambda path, max_bytes=64 * 1024 * 1024: use_source(SearchSource(None, str(path), max_bytes))
    use_source(SearchSource())


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_a_team_corpus_file_replaces_the_bundled_one(use_corpus: Callable[..., None], tmp_path: Path) -> None:
    docs = [{"title": "报销流程", "text": "差旅报销须在出差结束后30天内通过财务系统提交。"},
            {"title": "VPN", "text": "Connect to the office VPN with the vpn.example.com profile."}]
    path = _write(tmp_path / "kb.jsonl", [json.dumps(d, ensure_ascii=False) for d in docs] + [""])
    use_corpus(path)
    answer = search_tool(SearchArgs(query="报销要在多少天内提交"))
    assert answer.startswith("1. 报销流程: 差旅报销须在出差结束后30天内")
    assert "VPN" in search_tool(SearchArgs(query="office vpn profile"))
    assert search_tool(SearchArgs(query="capital of France")) == "No results for 'capital of France'."
    # the file is read again when it changes
    _write(path, [json.dumps({"title": "Paris", "text": "Paris is the capital of France."})])
    assert "Paris is the capital" in search_tool(SearchArgs(query="capital of France"))


@pytest.mark.parametrize(("lines", "problem"), [
    (['{"title": "a", "text": "b"}', "{not json"], "line 2: not JSON"),
    (['["a", "b"]'], 'line 1: expected {"title": str, "text": str}'),
    (['{"title": "a"}'], 'line 1: expected {"title": str, "text": str}'),
    (['{"title": 1, "text": "b"}'], 'line 1: expected {"title": str, "text": str}'),
    (['{"title": "a", "text": "b", "url": "x"}'], "line 1: unknown field(s) ['url']"),
    (['', '{"title": "a", "text": "  "}'], "line 2: empty text"),
    ([json.dumps({"title": "a", "text": "x" * (web.MAX_TEXT_CHARS + 1)})], "line 1: title over"),
    ([""], "no documents"),
])
def test_a_bad_corpus_file_names_its_line(tmp_path: Path, lines: list[str], problem: str) -> None:
    path = _write(tmp_path / "kb.jsonl", lines)
    with pytest.raises(ToolError) as caught:
        load_corpus_file(str(path), 10**8)
    assert problem in str(caught.value) and str(path) in str(caught.value)


def test_corpus_file_size_is_bounded_and_bytes_must_be_utf8(tmp_path: Path) -> None:
    path = _write(tmp_path / "kb.jsonl", [json.dumps({"title": "a", "text": "b" * 100})])
    with pytest.raises(ToolError, match="more than REACTQ_SEARCH_CORPUS_MAX_BYTES"):
        load_corpus_file(str(path), 50)
    path.write_bytes(b'{"title": "a", "text": "\xff"}\n')
    with pytest.raises(ToolError, match="not UTF-8"):
        load_corpus_file(str(path), 10**6)
    with pytest.raises(ToolError, match="cannot be read"):
        load_corpus_file(str(tmp_path / "missing.jsonl"), 10**6)


def test_the_model_hears_only_that_the_knowledge_base_is_unavailable(
    use_corpus: Callable[..., None], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path / "secret-kb.jsonl", ['{"title": "a", "text": "b"}', "oops"])
    use_corpus(path)
    with pytest.raises(ToolError) as caught:
        search_tool(SearchArgs(query="anything"))
    assert caught.value.error_type == "search_corpus_invalid"
    assert "secret-kb" not in str(caught.value) and "unavailable" in str(caught.value)
    assert "secret-kb.jsonl line 2: not JSON" in caplog.text  # the operator is told exactly
    use_corpus(path, max_bytes=10)
    with pytest.raises(ToolError, match="unavailable"):
        search_tool(SearchArgs(query="anything"))


def test_the_runtime_points_the_search_tool_at_the_settings_corpus(tmp_path: Path) -> None:
    """The settings reach the tool through the runtime that loads the tools (no module below reads them)."""
    from worker.runtime.context import Runtime

    try:
        assert Runtime(Settings(search_corpus=str(tmp_path / "kb.jsonl"), search_corpus_max_bytes=123)).tools
        assert current_source() == SearchSource(None, str(tmp_path / "kb.jsonl"), 123)
    finally:
        use_source(SearchSource())
