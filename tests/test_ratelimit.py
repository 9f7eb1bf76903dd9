"""Provider limits shared by every worker (worker/ratelimit.py) and the stub's server-side limits."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest
import redis

from api_stub import FaultConfig, StubServer
from api_stub.limits import ServerLimits
from tests.fixtures_cluster import Cluster
from tests.fixtures_stub import StubControl
from tests.test_integration import assert_all_answered
from tests.test_recovery import inline_questions
from worker import keys
from worker.config import ModelSpec
from worker.core.models import LLMReply, Usage
from worker.errors import LLMThrottled
from worker.ratelimit import LimitedLLM, RateLimiter, estimate_tokens


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    c = redis.Redis.from_url(redis_url)
    c.flushdb()
    return c


def test_reservations_are_spaced_one_interval_apart_and_a_long_wait_reserves_nothing(client: redis.Redis) -> None:
    limiter = RateLimiter(client, {"m": ModelSpec(rpm=600)}, burst_s=0, max_wait_s=0.5)  # 10/s: 0.1 s apart
    waits = [limiter.try_acquire("m", 10).wait_s for _ in range(6)]
    assert waits[0] == 0
    gaps = [b - a for a, b in zip(waits, waits[1:], strict=False)]
    assert all(0.09 < g <= 0.1 for g in gaps), waits  # Redis's clock moves a little between calls
    with pytest.raises(LLMThrottled) as caught:
        limiter.try_acquire("m", 10)  # the 7th would start 0.6 s out: beyond max_wait
    assert caught.value.reason == "rpm" and 0.5 < caught.value.wait_s <= 0.6
    tat = float(client.get(keys.llm_limit("m", "rpm")))
    with pytest.raises(LLMThrottled):
        limiter.try_acquire("m", 10)
    assert float(client.get(keys.llm_limit("m", "rpm"))) == tat  # refusals reserve nothing


def test_burst_tolerance_lets_that_many_seconds_go_at_once(client: redis.Redis) -> None:
    limiter = RateLimiter(client, {"m": ModelSpec(rpm=600)}, burst_s=0.3, max_wait_s=0)
    immediate = 0
    try:
        while True:
            assert limiter.try_acquire("m", 1).wait_s == 0
            immediate += 1
    except LLMThrottled:
        pass
    assert immediate in (3, 4)  # 0.3 s of a 10/s budget (plus the one at the cell's edge)


def test_tokens_are_reserved_from_the_estimate_and_settled_from_the_usage(client: redis.Redis) -> None:
    limiter = RateLimiter(client, {"m": ModelSpec(tpm=60_000)}, burst_s=0, max_wait_s=5)  # 1 ms per token
    limiter.try_acquire("m", 1000)
    second = limiter.try_acquire("m", 1000).wait_s
    assert 0.99 < second <= 1.0  # the first call's 1,000 tokens take 1 s of the budget
    limiter.settle("m", reserved=1000, used=200)  # the second call used far less than reserved
    third = limiter.try_acquire("m", 100).wait_s
    assert 1.1 < third <= 1.2, third  # 1,000 + 200 tokens ahead of it, not 2,000


def test_a_provider_429_cools_the_model_down_for_every_worker(client: redis.Redis) -> None:
    spec = {"m": ModelSpec(rpm=6000)}
    one, other = RateLimiter(client, spec), RateLimiter(client, spec)  # two workers
    one.cool_down("m", 3.0)
    with pytest.raises(LLMThrottled) as caught:
        other.try_acquire("m", 1)
    assert caught.value.reason == "cooldown" and 2.5 < caught.value.wait_s <= 3.0
    one.cool_down("m", 0.5)  # a shorter Retry-After never shortens a cool-down
    assert client.pttl(keys.llm_cooldown("m")) > 2000


def test_models_without_limits_never_touch_redis(client: redis.Redis) -> None:
    limiter = RateLimiter(client, {"free": ModelSpec(fallbacks=["x"])})

    class Echo:
        def chat(self, messages: list, **options: object) -> LLMReply:
            return LLMReply(content="ok", usage=Usage(prompt_tokens=1, completion_tokens=1))

    assert LimitedLLM(Echo(), limiter).chat([{"role": "user", "content": "hi"}], model="free").content == "ok"
    assert client.dbsize() == 0


def test_limited_llm_sleeps_its_reserved_wait_then_settles(client: redis.Redis) -> None:
    limiter = RateLimiter(client, {"m": ModelSpec(rpm=60, tpm=600_000)}, burst_s=0, max_wait_s=1.5)
    slept: list[float] = []

    class Echo:
        def chat(self, messages: list, **options: object) -> LLMReply:
            return LLMReply(content="ok", usage=Usage(prompt_tokens=30, completion_tokens=5))

    llm = LimitedLLM(Echo(), limiter, sleep=slept.append)
    messages = [{"role": "user", "content": "x" * 400}]
    assert estimate_tokens(messages, {}) > 100 + 200
    llm.chat(messages, model="m")
    llm.chat(messages, model="m")
    assert slept[0] == pytest.approx(1.0, abs=0.01)  # 60 rpm: the second call starts a second later
    with pytest.raises(LLMThrottled):
        llm.chat(messages, model="m")  # the third would wait 2 s > 1.5: its slot goes back (re-queued)


def test_stub_server_limits_answer_429_with_retry_after() -> None:
    limits = ServerLimits(rpm=60, burst_s=1.0)
    assert limits.admit(100.0, 10) is None and limits.admit(100.0, 10) is None  # 1 s of burst, then paced
    refusal = limits.admit(100.0, 10)
    assert refusal is not None and refusal.budget == "rpm" and refusal.retry_after_s == pytest.approx(1.0)
    assert limits.admit(101.0, 10) is None

    with StubServer(faults=FaultConfig(tpm_limit=600)) as stub:  # 10 tokens a second
        llm = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0)
        messages = [{"role": "user", "content": "What is 2 + 2?"}]
        llm.chat.completions.create(model="m", messages=messages)
        with pytest.raises(openai.RateLimitError) as caught:
            llm.chat.completions.create(model="m", messages=messages)
        headers = caught.value.response.headers
        assert int(headers["retry-after"]) >= 1 and int(headers["retry-after-ms"]) > 0
        assert "tokens per minute" in caught.value.message
        assert httpx.get(f"{stub.url}/stub/stats").json()["by_status"] == {"200": 1, "429": 1}


LIMIT_RPM = 480  # what the workers are told: 8 calls a second, shared
STUB_RPM = 600  # what the stub enforces: 10 a second (with 1 s of burst)


@pytest.mark.integration
def test_three_workers_share_the_limit_reach_it_and_never_see_a_429(
    cluster: Cluster, stub_control: StubControl, tmp_path: Path
) -> None:
    stub_control.set_faults(rpm_limit=STUB_RPM, latency_ms=50)
    models = json.dumps({"reactq-stub": {"rpm": LIMIT_RPM}})
    for _ in range(3):
        cluster.start_worker(queues="steps", concurrency=16, REACTQ_MODELS=models)
    infile, expected = inline_questions(tmp_path, repeat=4)
    out = tmp_path / "out.jsonl"
    batch = cluster.start_batch(infile, out)
    samples: list[tuple[float, int]] = []  # (time, completions at the stub)
    while batch.poll() is None:
        samples.append((time.monotonic(), stub_control.stats()["completions"]))
        time.sleep(0.25)
    assert batch.returncode == 0, batch.stderr.read() if batch.stderr else ""
    assert_all_answered(out, expected)
    stats = stub_control.stats()
    assert stats["by_status"].get("429", 0) == 0, stats
    # The steady part of the batch (demand far above the limit): from the 20th call to 70% of them.
    total = stats["completions"]
    t0, c0 = next(s for s in samples if s[1] >= 20)
    t1, c1 = next(s for s in samples if s[1] >= int(total * 0.7))
    rate_per_min = (c1 - c0) / (t1 - t0) * 60
    print(f"limiter: {rate_per_min:.0f} calls/min at the stub (limit {LIMIT_RPM}), {total} calls, no 429")
    assert 0.9 * LIMIT_RPM <= rate_per_min <= 1.05 * LIMIT_RPM, (rate_per_min, total, samples[:5])
