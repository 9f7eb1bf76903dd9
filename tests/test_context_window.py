"""The model's context window: a provider's refusal of a prompt larger than the
context is recognised at the LLM edge as its own outcome, the conversation's budget follows a per-model
context size, and the pure decision after such a refusal (compact once, then end with a best-effort
answer)."""

from __future__ import annotations

import json

import pytest

from tests.test_llm import json_provider
from tests.test_prompts import TOOLS, tool_step
from worker.config import ModelSpec, Settings
from worker.core import best_effort
from worker.core.engine import CONTEXT_EXCEEDED_REASON, End, after_context_exceeded
from worker.core.models import LLMReply, Mode, RunStatus
from worker.core.prompts import (
    CONTEXT_MARGIN,
    DROPPED,
    build_messages,
    context_budget,
    drop_observation_bodies,
    estimate_tokens,
    step_messages,
)
from worker.errors import LLMError
from worker.llm.client import CONTEXT_EXCEEDED, OpenAIChat, context_exceeded
from worker.llm.context_guard import ContextGuard
from worker.metrics import LLM_OUTCOMES, SAFEGUARD_KINDS

LLAMA_CPP = {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                       "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}}
OPENAI = {"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages "
                    "resulted in 130000 tokens.", "type": "invalid_request_error", "param": "messages",
                    "code": "context_length_exceeded"}}
VLLM = {"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you requested "
        "5000 tokens (4000 in the messages, 1000 in the completion).", "type": "BadRequestError", "param": None,
        "code": 400}


@pytest.mark.parametrize("body", [LLAMA_CPP, OPENAI, VLLM, LLAMA_CPP["error"], OPENAI["error"]])
def test_context_refusals_are_recognised(body):
    assert context_exceeded(400, body)


@pytest.mark.parametrize(("status", "body", "message"), [
    (400, {"error": {"message": "Invalid 'messages': empty", "type": "invalid_request_error"}}, None),
    (400, {"error": {"message": "Unsupported parameter: 'stop'", "code": "unsupported_parameter"}}, None),
    (500, LLAMA_CPP, None),  # a server error is not a refusal of the prompt's size
    (429, OPENAI, None),
    (400, None, None),
    (400, "plain text", None),
    (400, ["odd"], None),
])  # fmt: skip
def test_other_errors_are_not_context_refusals(status, body, message):
    assert not context_exceeded(status, body, message)


def test_the_message_alone_can_say_so():
    assert context_exceeded(400, None, "Error code: 400 - This model's maximum context length is 4096 tokens")


@pytest.mark.parametrize(("payload", "outcome"), [(LLAMA_CPP, CONTEXT_EXCEEDED), (OPENAI, CONTEXT_EXCEEDED),
                                                   (VLLM, CONTEXT_EXCEEDED),
                                                   ({"error": {"message": "bad"}}, "client_error")])
def test_the_llm_edge_reports_a_context_refusal_as_its_own_outcome(payload, outcome):
    server = json_provider(400, json.dumps(payload))
    seen: list[str] = []
    client = OpenAIChat(f"http://127.0.0.1:{server.server_port}/v1", "k", max_retries=2,
                        on_attempt=lambda model, o, seconds: seen.append(o))
    try:
        with pytest.raises(LLMError) as failed:
            client.chat([{"role": "user", "content": "hi"}], model="m")
    finally:
        client.close()
        server.shutdown()
        server.server_close()
    assert failed.value.outcome == outcome and failed.value.attempts == 1  # a 400 is never retried
    assert seen == [outcome]
    assert ("context window" in str(failed.value)) == (outcome == CONTEXT_EXCEEDED)
    assert "130000" not in str(failed.value)  # the provider's message is not stored (it may echo the prompt)


def test_the_outcome_is_a_declared_label():
    assert CONTEXT_EXCEEDED in LLM_OUTCOMES and "context_exceeded" in SAFEGUARD_KINDS


# --- the budget follows the model's context window


def test_without_a_context_size_the_budget_is_the_setting():
    assert context_budget(6000, None, 1024) == 6000


def test_the_budget_is_the_window_less_the_reply_and_the_schemas():
    schemas = estimate_tokens([t.openai_schema() for t in TOOLS])
    assert context_budget(6000, 4096, 1024) == int(3072 * CONTEXT_MARGIN)
    assert context_budget(6000, 4096, 1024, TOOLS) == int((3072 - schemas) * CONTEXT_MARGIN)
    assert context_budget(6000, 1024, 1024) == 256  # never below a floor: the smallest conversation is sent


def test_a_model_declares_its_context_size():
    settings = Settings(models={"qwen": {"context_tokens": 4096}})
    assert settings.models["qwen"].context_tokens == 4096
    assert ModelSpec().context_tokens is None
    with pytest.raises(ValueError):
        ModelSpec(context_tokens=10)


def test_turn_messages_follow_the_runs_model(make_harness):
    from worker.core.models import Run, RunSpec
    from worker.runtime.prompt_inputs import turn_messages

    harness = make_harness(models={"small": {"context_tokens": 1024}}, llm_max_tokens=256)
    steps = [tool_step(i, ("calc", {"expression": f"{i}"}, "x" * 1500)) for i in range(6)]
    tools = harness.rt.tools.all()
    small = Run(spec=RunSpec(question="q"), model="small", mode=Mode.TEXT)
    big = Run(spec=RunSpec(question="q"), model="other", mode=Mode.TEXT)
    assert turn_messages(harness.rt, small, steps, tools)[1] > 0  # compacted to fit ~650 tokens
    assert turn_messages(harness.rt, big, steps, tools)[1] == 0  # the 6,000-token default holds them


# --- after a refusal: compact once, then end


def test_the_first_refusal_compacts_and_the_second_ends_the_run():
    assert after_context_exceeded(retried=False) == "compact"
    end = after_context_exceeded(retried=True)
    assert isinstance(end, End) and end.status == RunStatus.FAILED and end.reason == CONTEXT_EXCEEDED_REASON
    assert end.safeguard == "context_exceeded" and best_effort.eligible(end)
    assert "too long" in best_effort.instruction(end)


@pytest.mark.parametrize("mode", list(Mode))
def test_compaction_drops_older_observation_bodies_only(mode):
    steps = [tool_step(i, ("calc", {"expression": f"{i}"}, f"result {i} " + "x" * 500)) for i in range(3)]
    messages, _ = build_messages(mode, "q", steps, TOOLS, context_budget_tokens=10**9,
                                 system_template=_template(mode))
    compacted, dropped = drop_observation_bodies(messages)
    assert dropped == 2 and len(compacted) == len(messages)
    assert estimate_tokens(compacted) < estimate_tokens(messages)
    assert compacted[:2] == messages[:2]  # the system prompt and the question
    last = step_messages(mode, steps[-1])
    assert compacted[-len(last):] == last  # the latest step is whole
    text = json.dumps(compacted)
    assert text.count(DROPPED.split(":")[0]) == 2 and "result 0" not in text and "result 1" not in text
    assert "result 2" in text
    assert all(m["role"] == o["role"] and m.get("tool_call_id") == o.get("tool_call_id")
               for m, o in zip(compacted, messages, strict=True))
    assert [m for m in compacted if m["role"] == "assistant"] == [m for m in messages if m["role"] == "assistant"]


def test_compaction_of_a_conversation_without_observations_changes_nothing():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert drop_observation_bodies(messages) == (messages, 0)


def _template(mode: Mode):
    from worker.prompt_templates import system_template

    return system_template(Settings(), mode)


# --- the LLM client that compacts once after a refusal (worker/llm/context_guard.py)


class Refusing:
    """An LLMClient that refuses conversations longer than `fits` characters as too large for the model."""

    def __init__(self, fits: int, outcome: str = CONTEXT_EXCEEDED) -> None:
        self.fits = fits
        self.outcome = outcome
        self.sent: list[list[dict]] = []

    def chat(self, messages, **options):
        self.sent.append(messages)
        if len(json.dumps(messages)) > self.fits:
            raise LLMError("HTTP 400 (exceed_context_size_error)", 1, self.outcome)
        return LLMReply(content="ok")


def _conversation() -> list[dict]:
    steps = [tool_step(i, ("calc", {"expression": f"{i}"}, "x" * 2000)) for i in range(3)]
    return build_messages(Mode.TOOLS, "q", steps, TOOLS, context_budget_tokens=10**9,
                          system_template=_template(Mode.TOOLS))[0]


def test_a_refused_conversation_is_sent_again_compacted():
    messages = _conversation()
    inner = Refusing(fits=len(json.dumps(messages)) - 1000)
    assert ContextGuard(inner).chat(messages, model="m").content == "ok"
    assert inner.sent[0] == messages and inner.sent[1] == drop_observation_bodies(messages)[0]


def test_refused_again_the_call_fails_saying_why():
    inner = Refusing(fits=100)
    with pytest.raises(LLMError) as failed:
        ContextGuard(inner).chat(_conversation(), model="m")
    assert failed.value.outcome == CONTEXT_EXCEEDED and failed.value.attempts == 2 and len(inner.sent) == 2
    assert str(failed.value).startswith(CONTEXT_EXCEEDED_REASON)


def test_nothing_to_drop_fails_at_once():
    inner = Refusing(fits=10)
    with pytest.raises(LLMError) as failed:
        ContextGuard(inner).chat([{"role": "user", "content": "q"}], model="m")
    assert failed.value.outcome == CONTEXT_EXCEEDED and len(inner.sent) == 1


def test_other_failures_pass_through_untouched():
    inner = Refusing(fits=10, outcome="client_error")
    with pytest.raises(LLMError) as failed:
        ContextGuard(inner).chat(_conversation(), model="m")
    assert failed.value.outcome == "client_error" and len(inner.sent) == 1


def test_the_runtime_guards_its_model():
    from worker.runtime.context import Runtime

    assert isinstance(Runtime(settings=Settings()).llm, ContextGuard)  # no connection is made yet
