"""An in-process reactq, in the spirit of arq's burst worker: the real StepRunner and RunStore on the
test's real redis-server, a scripted model at the `LLMClient` seam and a dispatcher that records what
would be enqueued. `drain()` delivers queued steps one by one until nothing is queued. No Celery, no
subprocess, no sleep: a whole run takes milliseconds.

    def test_x(harness):
        harness.llm.script(call("calculator", {"expression": "6*7"}), final("42"))
        run_id = harness.submit("What is 6 * 7?")
        harness.drain()
        assert harness.run(run_id).answer == "42"
"""

from __future__ import annotations

import json
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from worker.config import Settings
from worker.core.models import LLMReply, Run, RunSpec, Step, ToolCall, Usage
from worker.core.outcome import Outcome, StepOutcome
from worker.errors import LLMError
from worker.runtime.context import Runtime
from worker.runtime.runner import Dispatcher, StepRunner
from worker.service.submit import submit
from worker.store.cas import Command
from worker.tasks.webhooks import send_delivery

Message = dict[str, Any]
Scripted = LLMReply | LLMError | Callable[[list[Message]], LLMReply]


def final(text: str, tokens: int = 10) -> LLMReply:
    """A prose reply without a tool call (the final answer in tools mode)."""
    return LLMReply(content=text, usage=Usage(prompt_tokens=tokens, completion_tokens=tokens // 2))


def call(name: str, arguments: dict[str, Any], *, call_id: str = "c1", tokens: int = 10) -> LLMReply:
    """A reply asking for one tool call."""
    return calls((name, arguments, call_id), tokens=tokens)


def calls(*wanted: tuple[str, dict[str, Any], str], tokens: int = 10) -> LLMReply:
    return LLMReply(
        tool_calls=[ToolCall(id=cid, name=name, arguments=json.dumps(args)) for name, args, cid in wanted],
        usage=Usage(prompt_tokens=tokens, completion_tokens=tokens // 2),
    )


class ScriptedLLM:
    """An `LLMClient` that answers from a queue. An entry may be a reply, an LLMError to raise, or a
    function of the messages (which may act on the world while "the call is in flight")."""

    def __init__(self) -> None:
        self.queue: deque[Scripted] = deque()
        self.requests: list[list[Message]] = []  # the messages of every call, in order
        self.options: list[dict[str, Any]] = []  # ... and its options (model, tools, tool_choice, stop, ...)

    def script(self, *replies: Scripted) -> None:
        self.queue.extend(replies)

    def chat(self, messages: list[Message], **options: Any) -> LLMReply:
        self.requests.append(messages)
        self.options.append(options)
        if not self.queue:
            raise AssertionError(f"the model was asked a turn nobody scripted (call {len(self.requests)})")
        entry = self.queue.popleft()
        if isinstance(entry, LLMError):
            raise entry
        return entry(messages) if callable(entry) else entry


class RecordingDispatch:
    """What the runner would enqueue: step deliveries (a FIFO the harness drains) and sandbox requests.

    As with Celery on Redis, a step's commit writes its next step's message itself (`step_commands`):
    here an RPUSH onto a list in the test's Redis, which `steps` and `sent_steps` take in (with a
    client of their own, so that bench/step_cpu.py counts only the runner's round trips), and only
    once a commit may have written one (the list is read as often as a worker would take a message,
    not on every look at the queue: bench/step_cpu.py counts redis-server's CPU)."""

    def __init__(self, redis_url: str) -> None:
        self._queued: deque[tuple[str, int]] = deque()
        self._sent: list[tuple[str, int]] = []  # every step ever enqueued
        self.sandbox: list[dict[str, Any]] = []
        self._redis = redis.Redis.from_url(redis_url)
        self._list = f"harness:sent:{uuid.uuid4().hex}"
        self._promised = self._received = 0  # messages commits were given to write; messages read

    @property
    def steps(self) -> deque[tuple[str, int]]:
        self._take_in()
        return self._queued

    @property
    def sent_steps(self) -> list[tuple[str, int]]:
        self._take_in()
        return self._sent

    def next_step(self, run_id: str, index: int, priority: int | None = None) -> None:
        """(The harness runs steps in FIFO order; the priority a submission gives is not modelled.)"""
        self._take_in()
        self._queued.append((run_id, index))
        self._sent.append((run_id, index))

    def step_commands(self, run_id: str, index: int) -> list[Command]:
        self._promised += 1
        return [("RPUSH", self._list, json.dumps([run_id, index]))]

    def _take_in(self) -> None:
        if self._received >= self._promised:  # (a fenced commit's message never comes: read each time)
            return
        with self._redis.pipeline() as pipe:
            written, _ = pipe.lrange(self._list, 0, -1).delete(self._list).execute()
        self._received += len(written)
        for raw in written:
            run_id, index = json.loads(raw)
            self._queued.append((run_id, index))
            self._sent.append((run_id, index))

    def send_sandbox(self, request: dict[str, Any]) -> None:
        self.sandbox.append(request)

    def as_dispatcher(self) -> Dispatcher:
        return Dispatcher(next_step=self.next_step, sandbox=self.send_sandbox, webhook=send_delivery,
                          step_commands=self.step_commands)

    def close(self) -> None:
        self._redis.close()


class Harness:
    """`real_llm=True` talks to the model at settings.llm_base_url instead (bench/step_cpu.py)."""

    def __init__(self, settings: Settings, *, real_llm: bool = False, redis_client: Any = None) -> None:
        self.llm = ScriptedLLM()
        self.rt = Runtime(settings, llm_client=None if real_llm else self.llm)
        if redis_client is not None:
            self.rt.redis = redis_client
        self.store = self.rt.store
        self.dispatch = RecordingDispatch(settings.redis_url)
        self.runner = StepRunner(self.rt, self.dispatch.as_dispatcher())
        self.outcomes: list[tuple[str, int, StepOutcome]] = []

    def submit(self, question: str, **spec: Any) -> str:
        [run] = submit(self.store, [RunSpec(question=question, **spec)], self.rt.settings, self.dispatch.next_step,
                       tenants=self.rt.tenants, budgets=self.rt.budgets)
        return run.id

    def deliver(self, run_id: str, index: int) -> StepOutcome:
        """One delivery of a step task, as Celery would make it."""
        result = self.runner.run_step(run_id, index)
        self.outcomes.append((run_id, index, result))
        return result

    def step(self) -> StepOutcome:
        """Deliver the oldest queued step."""
        run_id, index = self.dispatch.steps.popleft()
        return self.deliver(run_id, index)

    def drain(self, limit: int = 200) -> list[Outcome]:
        """Deliver queued steps until none is left; the outcomes in order."""
        seen = []
        while self.dispatch.steps:
            if len(seen) >= limit:
                raise AssertionError(f"still {len(self.dispatch.steps)} step(s) queued after {limit} deliveries")
            seen.append(self.step().outcome)
        return seen

    def run(self, run_id: str) -> Run:
        run = self.store.load_run(run_id)
        assert run is not None, f"run {run_id} has no record"
        return run

    def steps(self, run_id: str) -> list[Step]:
        return self.store.load_steps(run_id)

    def close(self) -> None:
        self.rt.redis.close()
        self.dispatch.close()


HARNESS_SETTINGS: dict[str, Any] = {"tenants": ["default", "acme"], "tool_cache_ttl_s": 0}


@pytest.fixture
def make_harness(redis_url: str) -> Iterator[Callable[..., Harness]]:
    """`make_harness(**settings)`: a harness on a clean Redis with those settings (REACTQ_ names, lower case)."""
    made: list[Harness] = []

    def make(**overrides: Any) -> Harness:
        h = Harness(Settings(redis_url=redis_url, **{**HARNESS_SETTINGS, **overrides}))
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.fixture
def harness(make_harness: Callable[..., Harness]) -> Harness:
    return make_harness()
