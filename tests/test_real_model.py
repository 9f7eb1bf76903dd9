"""reactq against a real model: llama.cpp's llama-server with SmolLM2-135M-Instruct (tests/fixtures_llama.py),
real `reactq worker` processes and a real redis-server.

A 135M model is often wrong, so nothing here checks that an answer is right. What must hold whatever it
answers: every run ends in a terminal state with a reason; no exception text reaches an answer, an error or an
observation; the tokens reactq records are the tokens the server served; no answer is a tool call written as
text; and a model server that goes away and comes back mid-run costs the run a wait, not its life. The
answers are written to real-model-answers.jsonl in the test's log directory and printed (`pytest -s`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.fixtures_cluster import Cluster, cluster_environment
from tests.fixtures_llama import ALIAS, LlamaServer, UsageProxy, llama_paths
from tests.fixtures_services import RedisServer
from tests.waiting import wait_for
from worker.core.models import Run, RunStatus, Step
from worker.store.runs import RunStore

pytestmark = pytest.mark.integration

EVAL_SET = Path(__file__).resolve().parent.parent / "worker" / "data" / "eval_set.jsonl"
# one calculator question, one search question, a two-part question, and one that needs no tool
QUESTION_IDS = ["q01", "q10", "q27", "nt01"]

# Settings for a slow CPU model: -c 8192 with -np 2 gives each request 4,096 tokens of context, which must hold
# the prompt (its history kept within REACTQ_CONTEXT_BUDGET_TOKENS, plus the tool schemas) and the reply
# (REACTQ_LLM_MAX_TOKENS). The 135M model reads ~140 and writes ~70 tokens a second on one idle core (both
# batches take about a minute), far fewer on a loaded one: REACTQ_LLM_TIMEOUT_S is far above any one call.
REAL_MODEL_ENV = {
    "REACTQ_MODEL": ALIAS,
    "REACTQ_LLM_API_KEY": "no-key",  # llama-server started without --api-key takes any
    "REACTQ_LLM_TIMEOUT_S": "600",
    "REACTQ_LLM_MAX_TOKENS": "384",
    "REACTQ_CONTEXT_BUDGET_TOKENS": "2000",
    "REACTQ_MAX_STEPS": "4",
    "REACTQ_PROMPT_DATE": "2026-01-15",
}
RUN_TIMEOUT_S = 1500  # for one batch of four questions

# Python's own exception text: a traceback, a `File "x.py", line N`, or an exception's repr
EXCEPTION_TEXT = re.compile(r"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+|"
                            r"\b[A-Z][A-Za-z]*(?:Error|Exception)\(")
TOOLS = ("calculator", "search", "python")
# a tool call written as text: a JSON object naming a tool or a function with arguments, a ReAct
# Action line, tool-call tags, or a tool's name called like a function
TOOL_CALL_TEXT = [
    re.compile(r"\{\s*\"(?:name|function|tool|tool_name|action)\"\s*:\s*\"(?:" + "|".join(TOOLS) + r")\"", re.I),
    re.compile(r"\"(?:arguments|parameters|action_input)\"\s*:\s*[\{\"]", re.I),
    re.compile(r"\"tool_calls?\"\s*:", re.I),
    re.compile(r"</?(?:tool_call|tools|function_call)>", re.I),
    re.compile(r"^\s*\**\s*Action(?: Input)?\s*\**\s*:", re.I | re.M),
    re.compile(r"^\s*`*(?:" + "|".join(TOOLS) + r")\s*\(\s*[\"'{]", re.I | re.M),
]


def eval_questions() -> list[dict[str, str]]:
    items = {item["id"]: item for item in map(json.loads, EVAL_SET.read_text().splitlines())}
    return [{"id": qid, "question": items[qid]["question"], "expected": items[qid]["expected"]}
            for qid in QUESTION_IDS]


def tool_call_as_text(answer: str) -> str | None:
    """The pattern an answer matches if it is a tool call written as text, else None."""
    for pattern in TOOL_CALL_TEXT:
        if pattern.search(answer):
            return pattern.pattern
    return None


def load(redis_url: str, run_id: str) -> tuple[Run, list[Step]]:
    client = redis.Redis.from_url(redis_url)
    try:
        store = RunStore(client)
        run = store.load_run(run_id)
        assert run is not None, f"run {run_id} vanished"
        return run, store.load_steps(run_id)
    finally:
        client.close()


def record(logdir: Path, entry: dict) -> None:
    """Keep what the model answered (and print it: visible with `pytest -s`)."""
    with (logdir / "real-model-answers.jsonl").open("a") as f:
        f.write(json.dumps(entry) + "\n")
    print(f"\n[real model] {json.dumps(entry)}")


def ended_with_a_reason(run: Run) -> str | None:
    """What is wrong with how the run ended, or None."""
    if not run.status.finished:
        return f"not finished: {run.status.value} (waiting_on={run.waiting_on})"
    if run.status == RunStatus.SUCCEEDED:
        return None if (run.answer or "").strip() else "succeeded without an answer"
    return None if (run.error or "").strip() else f"{run.status.value} without an error saying why"


def exception_texts(run: Run, steps: list[Step]) -> list[str]:
    texts = [("answer", run.answer or ""), ("error", run.error or "")]
    texts += [(f"step {s.index} observation ({o.tool})", o.content) for s in steps for o in s.observations]
    texts += [(f"step {s.index} error", s.error or "") for s in steps]
    return [f"{where}: {text[:300]!r}" for where, text in texts if EXCEPTION_TEXT.search(text)]


@pytest.fixture(scope="module")
def real_cluster(llama_proxy: UsageProxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A redis-server of the module's own (the session's is flushed by other tests) and one step worker
    (threads) talking to llama-server through the recording proxy."""
    logdir = tmp_path_factory.mktemp("real-model")
    (logdir / "redis").mkdir()
    redis_server = RedisServer(logdir / "redis")
    redis_server.start()
    env = cluster_environment(redis_server.url, llama_proxy.base_url)
    env.update(REAL_MODEL_ENV)
    cluster = Cluster(env, logdir)
    try:
        cluster.start_worker(concurrency=4)
        yield cluster
    finally:
        cluster.stop()
        redis_server.stop()


@pytest.mark.parametrize("mode", ["text", "tools"])
def test_eval_questions_end_with_a_reason_and_the_servers_token_count(
    real_cluster: Cluster, llama_proxy: UsageProxy, llama: LlamaServer, tmp_path: Path, mode: str
) -> None:
    infile, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    questions = eval_questions()
    infile.write_text("".join(json.dumps({"id": f"{q['id']}-{mode}", "question": q["question"]}) + "\n"
                              for q in questions))
    served_before, metrics_before = len(llama_proxy.snapshot()), llama.metrics()
    started = time.monotonic()
    result = real_cluster.reactq("batch", str(infile), "--out", str(out), timeout=RUN_TIMEOUT_S, REACTQ_MODE=mode)
    seconds = round(time.monotonic() - started, 1)
    lines = {line["id"]: line for line in map(json.loads, out.read_text().splitlines())} if out.exists() else {}
    assert set(lines) == {f"{q['id']}-{mode}" for q in questions}, (result.returncode, result.stderr[-2000:])

    problems: list[str] = []
    recorded_prompt = recorded_completion = 0
    for q in questions:
        line = lines[f"{q['id']}-{mode}"]
        run, steps = load(real_cluster.env["REACTQ_REDIS_URL"], line["run_id"])
        assert run.mode.value == mode
        record(real_cluster.logdir, {
            "mode": mode, "id": q["id"], "question": q["question"], "expected": q["expected"],
            "status": run.status.value, "answer": run.answer, "error": run.error, "steps": len(steps),
            "tools": [c.name for s in steps for c in s.tool_calls], "usage": run.usage.model_dump(),
            "seconds_for_batch": seconds})
        if (why := ended_with_a_reason(run)) is not None:
            problems.append(f"{q['id']}: {why}")
        problems += [f"{q['id']}: exception text in {found}" for found in exception_texts(run, steps)]
        if run.answer and (pattern := tool_call_as_text(run.answer)) is not None:
            problems.append(f"{q['id']}: the answer is a tool call written as text ({pattern}): {run.answer[:300]!r}")
        # each step's usage is in the run's, and the batch line says the same
        assert run.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in steps), q["id"]
        assert run.usage.completion_tokens == sum(s.usage.completion_tokens for s in steps), q["id"]
        assert line["usage"] == run.usage.model_dump(), q["id"]
        recorded_prompt += run.usage.prompt_tokens
        recorded_completion += run.usage.completion_tokens

    served = llama_proxy.snapshot()[served_before:]
    answered = [s for s in served if s.status == 200]
    assert answered, "the server answered no chat completion"
    served_tokens = (sum(s.usage.get("prompt_tokens", 0) for s in answered),
                     sum(s.usage.get("completion_tokens", 0) for s in answered))
    assert served_tokens[1] > 0
    assert (recorded_prompt, recorded_completion) == served_tokens, (
        f"reactq recorded {recorded_prompt} prompt and {recorded_completion} completion tokens; the server "
        f"served {served_tokens} in {len(answered)} completions ({len(served)} requests)")
    # the server's own counters agree: every token it read (from its prompt cache or not) and generated is in a run
    metrics = llama.metrics()
    predicted = metrics["llamacpp:tokens_predicted_total"] - metrics_before["llamacpp:tokens_predicted_total"]
    prompt = sum(metrics[k] - metrics_before[k]
                 for k in ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"))
    print(f"\n[real model] /metrics: {predicted} predicted, {prompt} prompt (+cached); recorded "
          f"{recorded_completion} completion, {recorded_prompt} prompt")
    assert (prompt, predicted) == (recorded_prompt, recorded_completion), (prompt, predicted)
    assert not problems, "\n".join(problems)
    worker_log = real_cluster.log(real_cluster.procs[0])
    assert "Traceback" not in worker_log, worker_log[-3000:]


def test_the_model_server_going_away_mid_run_is_a_wait(own_redis: RedisServer, tmp_path: Path) -> None:
    """The outage test, against the real server: llama-server is killed (SIGKILL, a crash) while a run's first
    call is in flight, and comes back on the same port 30 s later. The run must ride it out: at the end of the
    outage it is finished with a reason or says what it is waiting on, and after the server is back it takes
    its next step there and ends in a terminal state with a reason (whatever the model then answers)."""
    binary, gguf = llama_paths()
    server = LlamaServer(binary, gguf, tmp_path).start()
    env = cluster_environment(own_redis.url, server.base_url)
    env.update(REAL_MODEL_ENV)
    cluster = Cluster(env, tmp_path)
    try:
        # text mode: its longer first prompt (~1,000 tokens, several seconds to read) keeps the call in flight
        cluster.start_worker(queues="steps", concurrency=4, REACTQ_MODE="text")
        result = cluster.reactq("ask", "What is (17 + 25) * 3?", REACTQ_MODE="text", check=True)
        run_id = result.stdout.strip().splitlines()[-1]

        def busy() -> bool:
            """A completion in flight on the server (a first call missed, answered already, fails the test)."""
            run, steps = load(own_redis.url, run_id)
            if steps or run.status.finished:
                raise AssertionError(f"run {run_id} took a step before the server could be killed mid-call")
            return server.metrics().get("llamacpp:requests_processing", 0) > 0

        wait_for(f"run {run_id}'s first call to reach llama-server", busy, 300, 0.05)
        server.kill()
        seen: list[str] = []
        down_until = time.monotonic() + 30
        while time.monotonic() < down_until:
            run, _ = load(own_redis.url, run_id)
            if run.status.finished:
                seen.append(f"{run.status.value}: {run.error}")
                break
            seen.append(f"{run.status.value} waiting_on={run.waiting_on}")
            time.sleep(1)
        server.start()
        back_at = time.time()
        cluster.wait_for_run(run_id, timeout=RUN_TIMEOUT_S)
        run, steps = load(own_redis.url, run_id)
        record(tmp_path, {"test": "outage", "run_id": run_id, "status": run.status.value, "answer": run.answer,
                          "error": run.error, "steps": len(steps), "seen_while_down": seen})
        assert ended_with_a_reason(run) is None, ended_with_a_reason(run)
        assert not exception_texts(run, steps), exception_texts(run, steps)
        # at the end of the outage the run had ended with a reason or said what it was waiting on
        assert seen and not seen[-1].endswith("waiting_on=None"), (
            f"30 s into the outage the run showed no reason for not moving: {seen}")
        # ... and it was not the outage that ended it: it went on with the server once that was back
        assert [s for s in steps if s.finished_at >= back_at], (
            f"the run took no step after llama-server came back; it ended {run.status.value}: {run.error} "
            f"(seen while down: {seen})")
    finally:
        cluster.stop()
        server.stop()
