"""A worker-like process for tests/test_limiter_load.py: `python -m tests.limiter_callers BASE_URL REDIS_URL
RPM CALLS THREADS` calls model `m` through the shared limiter (no window_s) until CALLS answers came back,
then prints what went wrong, one line each. Several of these are several workers sharing the limiter."""

from __future__ import annotations

import sys
import threading
import time

import redis

from worker.config import ModelSpec
from worker.errors import LLMError, LLMThrottled
from worker.llm.client import OpenAIChat
from worker.llm.ratelimit import LimitedLLM, RateLimiter
from worker.store.provider_limits import ProviderLimits


def call_until_done(llm: LimitedLLM, calls: int, callers: int) -> list[str]:
    """`callers` threads call until `calls` answers came back; throttled calls wait their countdown and try
    again (as a re-queued step does). What went wrong, by exception name."""
    done, problems, lock = [0], [], threading.Lock()

    def caller() -> None:
        while True:
            with lock:
                if done[0] >= calls:
                    return
            try:
                llm.chat([{"role": "user", "content": "What is 2 + 2?"}], model="m")
            except LLMThrottled as throttled:
                time.sleep(throttled.wait_s)
                continue
            except LLMError as exc:
                with lock:
                    problems.append(type(exc).__name__)
                continue
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return problems


def main(base_url: str, redis_url: str, rpm: str, calls: str, threads: str) -> None:
    limiter = RateLimiter(ProviderLimits(redis.Redis.from_url(redis_url)), {"m": ModelSpec(rpm=int(rpm))})
    chat = OpenAIChat(base_url, "k", max_retries=0, before_send=limiter.before_send,
                      before_retry=limiter.before_retry)
    for problem in call_until_done(LimitedLLM(chat, limiter), int(calls), int(threads)):
        print(problem)
    chat.close()


if __name__ == "__main__":
    main(*sys.argv[1:6])
