"""The shared limiter against a provider that quantises its per-minute limit into short windows
(docs/decisions/rate-limits.md): the pacing math, the stub's fixed windows, the window guard, and three
workers against the stub."""

from __future__ import annotations

import json
import math
import time
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
from worker.errors import LLMThrottled
from worker.llm.client import OpenAIChat
from worker.llm.ratelimit import RateLimiter, pacing, window_burst_us, window_share
from worker.store import keys
from worker.store.provider_limits import ProviderLimits

PROVIDER_RPM, WINDOW_S = 240, 2  # the provider: 8 requests in each 2-second window
LIMIT_RPM = 200  # what reactq is told (7 per window, rounded up)


def most_in_a_window(starts: list[float] | list[int], window: float) -> int:
    """The most of `starts` in any half-open window [x, x + window)."""
    ordered = sorted(starts)
    return max((sum(1 for s in ordered[i:] if s < first + window) for i, first in enumerate(ordered)), default=0)


def gcra_starts(calls: int, interval_us: float, burst_us: float) -> list[int]:
    """When back-to-back callers start from an idle cell, in µs: each waits for the cell's TAT less the
    burst, and the TAT moves one interval per call (kept in whole µs, as the script does)."""
    starts, tat = [], 0
    for _ in range(calls):
        starts.append(max(0, tat - burst_us))
        tat = round(tat + interval_us)
    return starts


# --- the pacing math (pure) ---

def test_a_windows_share_is_the_limit_times_the_window_rounded_up() -> None:
    assert window_share(LIMIT_RPM, WINDOW_S) == 7  # 6.67
    assert window_share(PROVIDER_RPM, WINDOW_S) == 8
    assert window_share(600, 1) == 10 and window_share(20, 1) == 1 and window_share(7, 0.1) == 1


@pytest.mark.parametrize("rpm", [7, 60, 200, 240, 250, 480, 1000, 6000])
@pytest.mark.parametrize("window_s", [0.5, 1, 2, 10])
def test_the_capped_burst_never_lets_a_window_see_more_than_its_share(rpm: int, window_s: float) -> None:
    interval_us = 60e6 / rpm
    burst_us = window_burst_us(interval_us, window_s * 1e6, burst_us=5_000_000)
    assert 0 <= burst_us < interval_us
    starts = gcra_starts(3 * window_share(rpm, window_s) + 3, interval_us, burst_us)
    assert most_in_a_window(starts, window_s * 1e6) <= window_share(rpm, window_s)
    # a little more burst than the cap (when the window caps it) would let one more call in
    if 0 < burst_us < 5_000_000:
        more = gcra_starts(3 * window_share(rpm, window_s) + 3, interval_us, burst_us + 2)
        assert most_in_a_window(more, window_s * 1e6) == window_share(rpm, window_s) + 1


def test_the_old_half_second_burst_puts_nine_calls_in_a_two_second_window() -> None:
    """Without a window: 200/min with REACTQ_LLM_LIMIT_BURST_S=0.5 after a lull sends
    calls at 0, 0, 0.1, 0.4, ... 1.9 s: nine in two seconds, where the provider admits eight."""
    starts = gcra_starts(12, 60e6 / LIMIT_RPM, 500_000)
    assert most_in_a_window(starts, WINDOW_S * 1e6) == 9 > window_share(PROVIDER_RPM, WINDOW_S)


def test_pacing_takes_the_window_per_model() -> None:
    windowed = pacing(ModelSpec(rpm=LIMIT_RPM, tpm=100_000, window_s=WINDOW_S), burst_s=0.5)
    assert windowed.rpm_us == pytest.approx(300_000) and windowed.tpm_us == pytest.approx(600)
    assert windowed.rpm_burst_us == 99_999  # 7 x 0.3 s - 2 s, less a µs
    assert windowed.tpm_burst_us < 600  # less than one token's interval
    assert (windowed.window_us, windowed.window_calls, windowed.spacing_us) == (2_000_000, 7, 150_000)
    assert ModelSpec(rpm=1).window_s is None  # the default: the provider's window is unknown
    unknown = pacing(ModelSpec(rpm=LIMIT_RPM, tpm=100_000), burst_s=0.5)
    assert (unknown.rpm_burst_us, unknown.tpm_burst_us) == (0, 0)  # admission: one call per interval
    assert (unknown.window_us, unknown.window_calls, unknown.spacing_us) == (1_000_000, 4, 300_000)
    old = pacing(ModelSpec(rpm=LIMIT_RPM, window_s=0), burst_s=0.5)
    assert (old.rpm_burst_us, old.window_us, old.window_calls) == (500_000, 0, 0)
    assert pacing(ModelSpec(tpm=1000), burst_s=0.5).window_calls == 0  # no request budget, no guard


def test_tokens_are_paced_one_token_interval_apart_whatever_the_burst_setting(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    spec = ModelSpec(tpm=60_000, window_s=1)  # 1 ms a token
    limiter = RateLimiter(ProviderLimits(client), {"m": spec}, burst_s=3, max_wait_s=5)
    assert limiter.try_acquire("m", 1000).wait_s == 0
    assert 0 < limiter.try_acquire("m", 1000).wait_s <= 1.0  # 3 s of burst would have let it go at once
    windowless = RateLimiter(ProviderLimits(client), {"w": ModelSpec(tpm=60_000, window_s=0)}, burst_s=3)
    assert windowless.try_acquire("w", 1000).wait_s == 0 and windowless.try_acquire("w", 1000).wait_s == 0


# --- the stub's fixed windows (pure, then over HTTP) ---

def test_stub_fixed_windows_admit_their_share_and_refuse_until_the_next_window() -> None:
    limits = ServerLimits(rpm=PROVIDER_RPM, window_s=WINDOW_S)
    assert all(limits.admit(100.5 + i * 0.01, 10) is None for i in range(8))  # the window [100, 102)
    refusal = limits.admit(101.0, 10)
    assert refusal is not None and refusal.budget == "rpm" and refusal.retry_after_s == pytest.approx(1.0)
    assert limits.admit(102.0, 10) is None  # a new window, aligned to the clock, not to the first request

    tokens = ServerLimits(tpm=600, window_s=WINDOW_S)  # 20 tokens a window
    assert tokens.admit(10.0, 15) is None
    tokens.charge_completion(10.1, 5)
    refused = tokens.admit(10.2, 1)
    assert refused is not None and refused.budget == "tpm"
    assert tokens.admit(12.0, 50) is None  # larger than a window: admitted only into an empty one
    assert tokens.admit(12.5, 1) is not None


def test_stub_enforces_windows_over_http_and_lists_what_it_saw(make_stub) -> None:  # noqa: ANN001
    stub: StubServer = make_stub(FaultConfig(rpm_limit=60, limit_window_s=10))  # 10 per 10 s window
    llm = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    statuses = []
    for _ in range(12):
        try:
            llm.chat.completions.create(model="m", messages=messages)
            statuses.append(200)
        except openai.RateLimitError as exc:
            statuses.append(429)
            assert 1 <= int(exc.response.headers["retry-after"]) <= 10
    seen = httpx.get(f"{stub.url}/stub/stats/arrivals").json()
    # the twelve requests straddle at most one window boundary
    assert statuses.count(200) in range(10, 13) and len(seen["admitted"]) == statuses.count(200)
    assert len(seen["refused"]) == statuses.count(429)


# --- the window guard (real Redis) ---

@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    c = redis.Redis.from_url(redis_url)
    c.flushdb()
    return c


def test_the_window_guard_records_a_windows_share_then_holds(client: redis.Redis) -> None:
    cells = ProviderLimits(client)
    assert [cells.send("m", 2_000_000, 7, 0) for _ in range(7)] == [("ok", 0.0)] * 7
    status, wait_us = cells.send("m", 2_000_000, 7, 0)
    assert status == "window" and 0 < wait_us <= 2_000_000  # until the first of the seven leaves the window
    assert client.llen(keys.llm_window("m")) == 7  # a held call is not recorded
    assert cells.send("s", 2_000_000, 7, 0) == ("ok", 0)
    status, wait_us = cells.send("s", 2_000_000, 7, 1_000_000)  # one sent less than a spacing ago
    assert status == "window" and 0 < wait_us <= 1_000_000
    cells.cool_down("m", 30_000)  # a provider 429: calls reserved before it wait for its end
    status, wait_us = cells.send("m", 2_000_000, 7, 0)
    assert status == "cooldown" and 25e6 < wait_us <= 30e6


def test_a_slot_is_reserved_then_guarded_and_a_long_cool_down_gives_it_back(client: redis.Redis) -> None:
    limiter = RateLimiter(ProviderLimits(client), {"m": ModelSpec(rpm=LIMIT_RPM, window_s=WINDOW_S)},
                          max_wait_s=2)
    assert limiter.pace("m", 10) == 0  # an idle cell: at once
    assert client.get(keys.llm_limit("m", "rpm")) is not None and client.exists(keys.llm_window("m")) == 0
    assert limiter.before_send("m") == 0  # the client's hook, right before the request: recorded
    assert client.llen(keys.llm_window("m")) == 1
    assert limiter.before_send("m") <= 0.15  # a second one (held for up to half an interval), recorded
    assert client.llen(keys.llm_window("m")) == 2
    before = int(client.get(keys.llm_limit("m", "rpm")))
    limiter.before_retry("m")  # a 429's retry takes a new slot, one interval later
    assert int(client.get(keys.llm_limit("m", "rpm"))) == before + 300_000
    limiter.before_retry("unlimited")
    assert limiter.before_send("unlimited") == 0  # models without limits: nothing
    assert client.dbsize() == 2
    ProviderLimits(client).cool_down("m", 30_000)
    with pytest.raises(LLMThrottled) as caught:
        limiter.before_send("m")  # reserved before a long cool-down: given back
    assert caught.value.reason == "cooldown"
    old = RateLimiter(ProviderLimits(client), {"o": ModelSpec(rpm=LIMIT_RPM, window_s=0)})
    old.pace("o", 10)
    old.before_send("o")  # window_s 0: the limiter as it was, no guard
    assert client.exists(keys.llm_window("o")) == 0


def test_with_no_window_a_send_waits_a_full_interval_after_the_last_one(client: redis.Redis) -> None:
    """No `window_s`: the guard spaces sends one interval apart and never lets late calls catch up (a known
    window allows half an interval)."""
    limiter = RateLimiter(ProviderLimits(client), {"m": ModelSpec(rpm=LIMIT_RPM), "k": ModelSpec(rpm=LIMIT_RPM,
                                                                                                  window_s=2)})
    for model, least_s in (("m", 0.2), ("k", 0.0)):
        held: list[float] = []

        def sleep(seconds: float, held: list[float] = held) -> None:
            held.append(seconds)
            time.sleep(seconds)

        assert limiter.before_send(model, sleep=sleep) == 0
        limiter.before_send(model, sleep=sleep)  # at once: held until the spacing has passed
        assert held and least_s <= held[0] <= (0.3 if model == "m" else 0.15), (model, held)


@pytest.mark.parametrize(("status", "paced"), [(429, ["m"]), (500, [])])
def test_the_client_retries_a_429_only_through_the_limiter(make_stub, status: int, paced: list) -> None:  # noqa: ANN001
    stub: StubServer = make_stub(FaultConfig(fail_first_n=1, fail_status=status, retry_after_s=0))
    calls: list[str] = []
    sends: list[str] = []
    chat = OpenAIChat(stub.base_url, "k", max_retries=2, backoff_base_s=0.01, before_retry=calls.append,
                      before_send=sends.append)
    reply = chat.chat([{"role": "user", "content": "What is 2 + 2?"}], model="m")
    assert reply.attempts == 2 and calls == paced
    assert sends == ["m", "m"]  # the window guard before every request that goes out
    chat.close()


def reservation_starts(client: redis.Redis, limiter: RateLimiter, calls: int) -> tuple[list[float], float]:
    """Reserve `calls` slots back to back (as many waiting callers would) and return when each starts, on
    Redis's clock, and how far off a start may be: a start is the time read just before its reservation plus
    its wait, early by at most the time until the script ran (the largest such reading-to-reading gap)."""
    starts, late = [], 0.0
    for _ in range(calls):
        seconds, micros = client.time()
        before = seconds + micros / 1e6
        wait_s = limiter.try_acquire("m", 1).wait_s
        seconds, micros = client.time()
        late = max(late, seconds + micros / 1e6 - before)
        starts.append(before + wait_s)
    return starts, late


def refused_somewhere(starts: list[float]) -> bool:
    """Would the provider's fixed windows refuse any of these calls, wherever its window edges fall?"""
    for shift in range(40):  # the first call 0, 0.05, ... 1.95 s into a window
        limits = ServerLimits(rpm=PROVIDER_RPM, window_s=WINDOW_S)
        base = 1000.0 + shift * WINDOW_S / 40 - starts[0]
        if any(limits.admit(start + base, 1) is not None for start in starts):
            return True
    return False


def test_reservations_from_a_lull_fit_the_providers_windows_only_with_a_window(client: redis.Redis) -> None:
    """The same numbers on the real cells: 200/min after a lull, the default burst tolerance."""
    old = RateLimiter(ProviderLimits(client), {"m": ModelSpec(rpm=LIMIT_RPM, window_s=0)}, burst_s=0.5,
                      max_wait_s=10)
    assert refused_somewhere(reservation_starts(client, old, 12)[0])
    client.flushdb()
    new = RateLimiter(ProviderLimits(client), {"m": ModelSpec(rpm=LIMIT_RPM, window_s=WINDOW_S)}, burst_s=0.5,
                      max_wait_s=10)
    starts, late = reservation_starts(client, new, 12)
    # Each start may be early by up to `late` (a loaded machine: milliseconds), and the GCRA spaces the 8th
    # call exactly WINDOW_S after the 1st: 8 measured starts within WINDOW_S - late would mean 8 real ones
    # within WINDOW_S. At most 7 in any window is also what keeps the provider (8 a window) from refusing one.
    assert most_in_a_window(starts, WINDOW_S - late - 1e-6) <= 7


# --- three workers against the stub's 2-second windows ---

def busy_rate_per_minute(admitted: list[float]) -> float:
    """Calls per minute between the stub's admissions, leaving out the first 5% (workers taking their first
    steps) and the last 10% (the batch's tail, fewer runs left than the limit can serve)."""
    ordered = sorted(admitted)
    body = ordered[len(ordered) // 20: len(ordered) - len(ordered) // 10]
    return 60 * (len(body) - 1) / (body[-1] - body[0])


def run_three_workers(cluster: Cluster, stub_control: StubControl, tmp_path: Path, model: dict,
                      repeat: int, **env: str) -> tuple[dict, list[float], list[int]]:
    stub_control.set_faults(rpm_limit=PROVIDER_RPM, limit_window_s=WINDOW_S, latency_ms=50)
    models = json.dumps({"reactq-stub": model})
    ports = [metrics_port() for _ in range(3)]
    for port in ports:
        cluster.start_worker(queues="steps", concurrency=16, metrics_port=port, REACTQ_MODELS=models, **env)
    infile, expected = inline_questions(tmp_path, repeat=repeat)
    out = tmp_path / "out.jsonl"
    batch = cluster.start_batch(infile, out)
    _, errors = batch.communicate(timeout=400)
    assert batch.returncode == 0, errors
    assert_all_answered(out, expected)
    arrivals = httpx.get(f"{stub_control.root_url}/stub/stats/arrivals").json()
    return arrivals, arrivals["admitted"], ports


@pytest.mark.integration
def test_three_workers_pace_within_the_providers_windows_at_90_percent_of_the_limit(
    cluster: Cluster, stub_control: StubControl, tmp_path: Path
) -> None:
    """The target: the stub enforces 240/min as 8 per 2-second window (aligned to the clock);
    reactq is told 200/min over 2-second windows; 3 workers x 16 threads (50 ms per call) want far more.
    No call is refused, and between the batch's first steps and its tail the calls come at >= 90% of
    200/min: a ratio of the limiter's pacing, which does not depend on the machine's speed as long as the
    workers keep more callers waiting than the limit serves."""
    arrivals, admitted, ports = run_three_workers(cluster, stub_control, tmp_path,
                                                  {"rpm": LIMIT_RPM, "window_s": WINDOW_S}, repeat=4)
    stats = stub_control.stats()
    assert stats["by_status"].get("429", 0) == 0 and arrivals["refused"] == [], stats
    assert len(admitted) >= 120, stats
    rate = busy_rate_per_minute(admitted)
    held = {reason: sum(total(scrape(f"http://127.0.0.1:{port}/metrics"), "reactq_llm_throttled_total",
                              model="reactq-stub", reason=reason) for port in ports)
            for reason in ("pacing", "window", "provider_429")}
    print(f"limiter windows: {len(admitted)} calls, {rate:.1f}/min in the busy part, held back {held}, no 429")
    assert held["provider_429"] == 0
    assert rate >= 0.9 * LIMIT_RPM, (rate, held)


@pytest.mark.integration
def test_without_a_window_the_same_workers_burst_past_the_providers_window(
    cluster: Cluster, stub_control: StubControl, tmp_path: Path
) -> None:
    """The check above can fail: with no window (`window_s` 0, the limiter as it was) and a burst
    tolerance of 3 s (a setting the window caps), the first calls go ten at once and the stub refuses
    some. With a window the same setting sends at most 7 per window (the pure tests above)."""
    arrivals, admitted, _ = run_three_workers(cluster, stub_control, tmp_path, {"rpm": LIMIT_RPM, "window_s": 0},
                                              repeat=1, REACTQ_LLM_LIMIT_BURST_S="3")
    assert len(arrivals["refused"]) > 0, stub_control.stats()
    assert math.isfinite(busy_rate_per_minute(admitted))
