"""Provider limits shared by every worker (worker/llm/ratelimit.py) and the stub's server-side limits."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
import redis

from api_stub import FaultConfig, StubServer
from api_stub.limits import ServerLimits
from tests.fixtures_cluster import Cluster, metrics_port
from tests.fixtures_prometheus import scrape, total
from tests.fixtures_stub import StubControl
from tests.test_integration import assert_all_answered
from tests.test_recovery import inline_questions
from worker.config import ModelSpec
from worker.core.models import LLMReply, Usage
from worker.errors import LLMThrottled
from worker.llm.ratelimit import LimitedLLM, RateLimiter, estimate_tokens
from worker.store import keys
from worker.store.provider_limits import ProviderLimits


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    c = redis.Redis.from_url(redis_url)
    c.flushdb()
    return c


def reserved_until(client: redis.Redis, model: str, budget: str) -> int:
    """The cell's theoretical arrival time in µs (Redis's clock): where the next reservation would start."""
    return int(client.get(keys.llm_limit(model, budget)))


# The limiter's waits are computed on Redis's clock and shrink by however long the test took between calls,
# so these tests check the reservations themselves (the cells' TATs, exact) and give the waits a second of
# slack: a loaded machine cannot fail them.

def test_reservations_are_spaced_one_interval_apart_and_a_long_wait_reserves_nothing(client: redis.Redis) -> None:
    limiter = RateLimiter(ProviderLimits(client), {"m": ModelSpec(rpm=30)}, burst_s=0, max_wait_s=11)  # 2 s apart
    waits, tats = [], []
    for _ in range(6):
        waits.append(limiter.try_acquire("m", 10).wait_s)
        tats.append(reserved_until(client, "m", "rpm"))
    assert waits[0] == 0
    assert [b - a for a, b in zip(tats, tats[1:], strict=False)] == [2_000_000] * 5, tats
    assert all(2 * k - 1 < w <= 2 * k for k, w in enumerate(waits)), waits  # the k-th starts 2k s after the first
    with pytest.raises(LLMThrottled) as caught:
        limiter.try_acquire("m", 10)  # the 7th would start 12 s out: beyond max_wait
    assert caught.value.reason == "rpm" and 11 < caught.value.wait_s <= 12
    with pytest.raises(LLMThrottled):
        limiter.try_acquire("m", 10)
    assert reserved_until(client, "m", "rpm") == tats[-1]  # refusals reserve nothing


def test_burst_tolerance_lets_that_many_seconds_go_at_once(client: redis.Redis) -> None:
    # window_s=0: no provider window caps the burst (tests/test_limiter_windows.py checks the cap)
    limiter = RateLimiter(ProviderLimits(client), {"m": ModelSpec(rpm=60, window_s=0)}, burst_s=3, max_wait_s=0)
    immediate = 0
    try:
        while True:
            assert limiter.try_acquire("m", 1).wait_s == 0
            immediate += 1
    except LLMThrottled:
        pass
    # 3 s of a 1/s budget plus the one at the cell's edge (a fifth only if the calls took over a second)
    assert immediate in (4, 5)


def test_tokens_are_reserved_from_the_estimate_and_settled_from_the_usage(client: redis.Redis) -> None:
    limiter = RateLimiter(ProviderLimits(client), {"m": ModelSpec(tpm=60_000)}, burst_s=0, max_wait_s=5)  # 1 ms/token
    limiter.try_acquire("m", 1000)
    first = reserved_until(client, "m", "tpm")
    second = limiter.try_acquire("m", 1000).wait_s
    assert 0 < second <= 1.0  # the first call's 1,000 tokens take 1 s of the budget
    assert reserved_until(client, "m", "tpm") == first + 1_000_000
    limiter.settle("m", reserved=1000, used=200)  # the second call used far less than reserved
    assert reserved_until(client, "m", "tpm") == first + 200_000  # 1,000 + 200 tokens ahead, not 2,000
    third = limiter.try_acquire("m", 100).wait_s
    assert 0.2 < third <= 1.2, third
    assert reserved_until(client, "m", "tpm") == first + 300_000


def test_a_provider_429_cools_the_model_down_for_every_worker(client: redis.Redis) -> None:
    spec = {"m": ModelSpec(rpm=6000)}
    one, other = RateLimiter(ProviderLimits(client), spec), RateLimiter(ProviderLimits(client), spec)  # two workers
    one.cool_down("m", 30.0)
    with pytest.raises(LLMThrottled) as caught:
        other.try_acquire("m", 1)
    assert caught.value.reason == "cooldown" and 25 < caught.value.wait_s <= 30.0
    one.cool_down("m", 0.5)  # a shorter Retry-After never shortens a cool-down
    assert client.pttl(keys.llm_cooldown("m")) > 20_000


def test_models_without_limits_never_touch_redis(client: redis.Redis) -> None:
    limiter = RateLimiter(ProviderLimits(client), {"free": ModelSpec(fallbacks=["x"])})

    class Echo:
        def chat(self, messages: list, **options: object) -> LLMReply:
            return LLMReply(content="ok", usage=Usage(prompt_tokens=1, completion_tokens=1))

    assert LimitedLLM(Echo(), limiter).chat([{"role": "user", "content": "hi"}], model="free").content == "ok"
    assert client.dbsize() == 0


def test_limited_llm_sleeps_its_reserved_wait_then_settles(client: redis.Redis) -> None:
    limiter = RateLimiter(ProviderLimits(client), {"m": ModelSpec(rpm=6, tpm=600_000)}, burst_s=0, max_wait_s=15)
    slept: list[float] = []

    class Echo:
        def chat(self, messages: list, **options: object) -> LLMReply:
            return LLMReply(content="ok", usage=Usage(prompt_tokens=30, completion_tokens=5))

    llm = LimitedLLM(Echo(), limiter, sleep=slept.append)
    messages = [{"role": "user", "content": "x" * 400}]
    assert estimate_tokens(messages, {}) > 100 + 200
    llm.chat(messages, model="m")
    llm.chat(messages, model="m")
    assert slept[0] == pytest.approx(10.0, abs=1)  # 6 rpm: the second call starts 10 s later (sleep is faked)
    with pytest.raises(LLMThrottled):
        llm.chat(messages, model="m")  # the third would wait 20 s > 15: its slot goes back (re-queued)


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
STUB_BURST_S = 5  # what the stub also enforces, server-side, with this allowance (40 calls)


@pytest.mark.integration
def test_three_workers_share_the_limit_reach_it_and_never_see_a_429(
    cluster: Cluster, stub_control: StubControl, tmp_path: Path
) -> None:
    """Demand (3 workers x 16 threads, 50 ms per call) is far above the limit.

    "Reached" is read from the limiter, not the clock: nearly every call waited for its reserved slot, so
    slots were handed out back to back, one interval apart, which is the limit itself (the unit tests above
    check the spacing exactly). "Never above" is the stub's own verdict: it enforces the same 480 rpm on
    arrival, and no call was refused. Its allowance absorbs calls that arrive late and together (a worker
    descheduled on a loaded machine wakes several paced threads at once); without the limiter, 48 threads
    would spend those 40 calls in a tenth of a second."""
    stub_control.set_faults(rpm_limit=LIMIT_RPM, limit_burst_s=STUB_BURST_S, latency_ms=50)
    models = json.dumps({"reactq-stub": {"rpm": LIMIT_RPM}})
    ports = [metrics_port() for _ in range(3)]
    for port in ports:
        cluster.start_worker(queues="steps", concurrency=16, metrics_port=port, REACTQ_MODELS=models)
    infile, expected = inline_questions(tmp_path, repeat=4)
    out = tmp_path / "out.jsonl"
    batch = cluster.start_batch(infile, out)
    _, errors = batch.communicate(timeout=300)
    assert batch.returncode == 0, errors
    assert_all_answered(out, expected)
    stats = stub_control.stats()
    assert stats["by_status"].get("429", 0) == 0, stats
    calls = stats["completions"]
    held = {reason: sum(total(scrape(f"http://127.0.0.1:{port}/metrics"), "reactq_llm_throttled_total",
                              model="reactq-stub", reason=reason) for port in ports)
            for reason in ("pacing", "rpm")}
    print(f"limiter: {calls} calls, held back {held}, no 429")
    # Only the limiter's burst (half a second of calls) and calls after a lull (the batch's tail) go at once;
    # the rest waited for their slot (slept), most after first being re-queued for a later one.
    assert held["pacing"] >= 0.8 * calls, (held, calls)
