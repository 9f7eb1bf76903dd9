"""api_stub over real HTTP with the official `openai` client: protocol, usage, faults, load."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from api_stub import FaultConfig, StubServer
from tests.fixtures_services import start_on_free_port
from tests.fixtures_stub import StubControl

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", "function": {"name": name, "description": f"the {name} tool",
                                           "parameters": {"type": "object", "properties": {arg: {"type": "string"}},
                                                          "required": [arg]}}}
         for name, arg in (("calculator", "expression"), ("search", "query"), ("python", "code"))]
SYSTEM = "Use the tools calculator, search, python.\nThought/Action/Action Input/Observation/Final Answer."


def client(base_url: str, **kwargs) -> OpenAI:  # noqa: ANN003
    return OpenAI(base_url=base_url, api_key="x", **kwargs)


def text_messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question: {question}"}]


def test_tools_mode_round_trip_sync(stub_base_url: str) -> None:
    llm = client(stub_base_url)
    messages: list = [{"role": "user", "content": "What is 12*7 and what is 9*9?"}]
    first = llm.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert first.model == "gpt-4o-mini" and choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert [json.loads(c.function.arguments) for c in calls] == [{"expression": "12*7"}, {"expression": "9*9"}]
    messages.append(choice.message.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": v} for c, v in zip(calls, ["84", "81"],
                                                                                      strict=True)]
    final = llm.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.tool_calls is None
    assert "84" in final.choices[0].message.content and "81" in final.choices[0].message.content
    usage = final.usage
    assert usage.prompt_tokens > first.usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_text_mode_and_determinism(stub_base_url: str) -> None:
    llm = client(stub_base_url)
    replies = [llm.chat.completions.create(model="m", messages=text_messages("What is 17 * 23 + 4?"))
               for _ in range(2)]
    content = replies[0].choices[0].message.content
    assert content.splitlines()[1:] == ["Action: calculator", 'Action Input: {"expression": "17 * 23 + 4"}']
    assert replies[1].choices[0].message.content == content
    assert replies[0].usage == replies[1].usage and replies[0].usage.completion_tokens > 0
    follow = text_messages("What is 17 * 23 + 4?") + [{"role": "assistant", "content": content},
                                                      {"role": "user", "content": "Observation: 395"}]
    final = llm.chat.completions.create(model="m", messages=follow)
    assert final.choices[0].message.content.endswith("Final Answer: 395")


def test_async_client(stub_base_url: str) -> None:
    async def main() -> str:
        async with AsyncOpenAI(base_url=stub_base_url, api_key="x") as llm:
            reply = await llm.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Who wrote Pride and Prejudice?"}], tools=TOOLS)
            return reply.choices[0].message.tool_calls[0].function.arguments

    assert json.loads(asyncio.run(main())) == {"query": "wrote Pride Prejudice"}


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_streaming_with_usage_matches_non_streaming(stub_base_url: str, tools: list | None) -> None:
    llm = client(stub_base_url)
    messages = [{"role": "user", "content": "What is 3+4 and what is the capital of France?"}]
    extra = {"tools": tools} if tools else {}
    if not tools:
        messages = text_messages(messages[0]["content"])
    plain = llm.chat.completions.create(model="m", messages=messages, **extra)
    chunks = list(llm.chat.completions.create(model="m", messages=messages, stream=True,
                                              stream_options={"include_usage": True}, **extra))
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == plain.choices[0].message.content
    assert chunks[-2].choices[0].finish_reason == plain.choices[0].finish_reason
    args: dict[int, str] = {}
    for chunk in chunks[:-1]:
        for call in chunk.choices[0].delta.tool_calls or []:
            args[call.index] = args.get(call.index, "") + (call.function.arguments or "")
    assert [args[i] for i in sorted(args)] == [c.function.arguments for c in plain.choices[0].message.tool_calls
                                               or []]


def test_stream_with_the_sdk_helper_and_raw_done(stub_base_url: str) -> None:
    body = {"model": "m", "messages": text_messages("What is 2+2?"), "stream": True}
    raw = httpx.post(f"{stub_base_url}/chat/completions", json=body).text
    assert raw.rstrip().endswith("data: [DONE]") and '"usage"' not in raw


def test_an_undelayed_stream_is_one_body_with_the_paced_streams_events(stub_base_url: str) -> None:
    """Without a chunk delay the stub writes the stream's events as one body (what a server with the answer at
    once sends: the client reads the same events, without a wake-up per chunk); with one it paces them."""
    body = {"model": "m", "messages": text_messages("What is 6*7?"), "stream": True,
            "stream_options": {"include_usage": True}}
    whole = httpx.post(f"{stub_base_url}/chat/completions", json=body)
    paced = httpx.post(f"{stub_base_url}/chat/completions", json=body,
                       headers={"X-Stub-Faults": json.dumps({"chunk_delay_ms": 1})})
    assert whole.headers["content-type"].startswith("text/event-stream")
    assert whole.headers["content-length"] == str(len(whole.content))
    assert "content-length" not in paced.headers and paced.headers["transfer-encoding"] == "chunked"

    def events(raw: str) -> list[dict | str]:
        out: list[dict | str] = []
        for line in raw.splitlines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else {k: v for k, v in json.loads(data).items()
                                                          if k not in ("id", "created")})
        return out

    assert len(events(whole.text)) > 4 and events(whole.text) == events(paced.text)


def test_models_health_metrics(stub_server: StubServer, stub_base_url: str) -> None:
    assert [m.id for m in client(stub_base_url).models.list()] == ["reactq-stub"]
    assert httpx.get(f"{stub_server.url}/healthz").json() == {"status": "ok"}
    client(stub_base_url).chat.completions.create(model="m", messages=text_messages("What is 2+2?"))
    metrics = httpx.get(f"{stub_server.url}/metrics").text
    assert 'reactq_stub_requests_total{outcome="ok"}' in metrics
    assert "reactq_stub_request_duration_seconds_bucket" in metrics


def test_error_shapes(stub_server: StubServer, stub_base_url: str) -> None:
    llm = client(stub_base_url, max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        llm.chat.completions.create(model="m", messages=[])
    assert caught.value.body["type"] == "invalid_request_error" and caught.value.body["param"] == "messages"
    bad = httpx.post(f"{stub_base_url}/chat/completions", content=b"{nope")
    assert bad.status_code == 400 and set(bad.json()["error"]) == {"message", "type", "param", "code"}
    missing = httpx.get(f"{stub_server.url}/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_url"
    header = httpx.post(f"{stub_base_url}/chat/completions", headers={"X-Stub-Faults": "{"},
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert header.status_code == 400 and "X-Stub-Faults" in header.json()["error"]["message"]
    assert httpx.post(f"{stub_server.url}/stub/faults", json={"error_rate_429": 2}).status_code == 400
    assert httpx.post(f"{stub_server.url}/stub/faults", json={"no_such": 1}).status_code == 400


def test_429_carries_retry_headers(stub_base_url: str, stub_control: StubControl) -> None:
    stub_control.set_faults(error_rate_429=1.0, retry_after_s=2)
    llm = client(stub_base_url, max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        llm.chat.completions.create(model="m", messages=text_messages("What is 2+2?"))
    headers = caught.value.response.headers
    assert headers["retry-after"] == "2" and headers["retry-after-ms"] == "2000"
    assert caught.value.body["code"] == "rate_limit_exceeded"
    assert stub_control.stats() == {"requests": 1, "completions": 0, "by_status": {"429": 1}, "peak_in_flight": 1}


def test_500_and_503_rates(make_stub) -> None:  # noqa: ANN001
    for field, error in (("error_rate_500", openai.InternalServerError), ("error_rate_503", openai.APIStatusError)):
        server = make_stub(FaultConfig(**{field: 1.0}))
        with pytest.raises(error):
            client(server.base_url, max_retries=0).chat.completions.create(
                model="m", messages=text_messages("What is 2+2?"))


def test_fail_first_n_then_recovers_and_stats(make_stub) -> None:  # noqa: ANN001
    server = make_stub(FaultConfig(fail_first_n=2, fail_status=503))
    llm = client(server.base_url, max_retries=0)
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as caught:
            llm.chat.completions.create(model="m", messages=text_messages("What is 2+2?"))
        assert caught.value.status_code == 503
    assert llm.chat.completions.create(model="m", messages=text_messages("What is 2+2?")).choices
    stats = httpx.get(f"{server.url}/stub/stats").json()
    assert stats == {"requests": 3, "completions": 1, "by_status": {"503": 2, "200": 1}, "peak_in_flight": 1}
    assert httpx.post(f"{server.url}/stub/stats/reset").json()["requests"] == 0
    # the sdk's own retries get through fail_first_n
    retrying = make_stub(FaultConfig(fail_first_n=1, fail_status=500))
    reply = client(retrying.base_url, max_retries=2).chat.completions.create(
        model="m", messages=text_messages("What is 2+2?"))
    assert reply.choices[0].message.content


def test_malformed_replies(stub_base_url: str, stub_control: StubControl) -> None:
    stub_control.set_faults(malformed_rate=1.0)
    llm = client(stub_base_url)
    reply = llm.chat.completions.create(model="m", tools=TOOLS,
                                        messages=[{"role": "user", "content": "What is 2+2?"}])
    with pytest.raises(ValueError):
        json.loads(reply.choices[0].message.tool_calls[0].function.arguments)
    text = llm.chat.completions.create(model="m", messages=text_messages("What is 2+2?")).choices[0].message.content
    assert "Final Answer" not in text and 'Action Input: {"expression": "2+2"}' not in text


def test_hallucination_and_stop(stub_base_url: str, stub_control: StubControl) -> None:
    stub_control.set_faults(hallucinate_rate=1.0)
    llm = client(stub_base_url)
    free = llm.chat.completions.create(model="m", messages=text_messages("What is 2+2?")).choices[0]
    assert "\nObservation: " in free.message.content and "Final Answer: 999999" in free.message.content
    cut = llm.chat.completions.create(model="m", messages=text_messages("What is 2+2?"),
                                      stop=["\nObservation:"]).choices[0]
    assert cut.finish_reason == "stop" and cut.message.content.endswith('Action Input: {"expression": "2+2"}')


def test_max_tokens_cuts_with_length(stub_base_url: str) -> None:
    reply = client(stub_base_url).chat.completions.create(model="m", messages=text_messages("What is 2+2?"),
                                                          max_tokens=3)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3
    assert reply.choices[0].message.content == "Thought:"  # Thou|ght|:


def test_latency_fixed_and_per_request_header(stub_base_url: str) -> None:
    llm = client(stub_base_url)
    started = time.perf_counter()
    llm.chat.completions.create(model="m", messages=text_messages("What is 2+2?"),
                                extra_headers={"X-Stub-Faults": json.dumps({"latency_ms": 300})})
    assert time.perf_counter() - started >= 0.3  # a lower bound: a loaded machine only adds to it
    # the header applied to that request only: the stub's own faults still add no latency
    root = stub_base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/stub/faults").json()["latency_ms"] == 0


def test_timeout_fault(stub_base_url: str, stub_control: StubControl) -> None:
    stub_control.set_faults(timeout_rate=1.0, timeout_s=0.3)
    with pytest.raises(openai.APIConnectionError):  # held, then dropped without a reply
        client(stub_base_url, max_retries=0).chat.completions.create(model="m", messages=text_messages("2+2?"))
    stub_control.set_faults(timeout_rate=1.0, timeout_s=5)
    with pytest.raises(openai.APITimeoutError):
        client(stub_base_url, max_retries=0, timeout=0.3).chat.completions.create(
            model="m", messages=text_messages("2+2?"))


def test_300_concurrent_requests_with_latency(make_stub) -> None:  # noqa: ANN001
    """The stub holds hundreds of requests at once (each sleeps its latency without blocking the others):
    its own count of requests in flight shows it, not the wall clock. A stub serving one at a time would
    peak at 1; the latency is long enough that all 300 are sent while the first ones still wait."""
    server = make_stub(FaultConfig(latency_ms=3000))

    async def main() -> list:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120,
                               http_client=None) as llm:
            return await asyncio.gather(*(llm.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"What is {i} + {i}?"}], tools=TOOLS)
                for i in range(300)))

    replies = asyncio.run(main())
    assert [json.loads(r.choices[0].message.tool_calls[0].function.arguments)["expression"] for r in replies] == [
        f"{i} + {i}" for i in range(300)]
    stats = httpx.get(f"{server.url}/stub/stats").json()
    assert stats["by_status"] == {"200": 300}
    assert stats["peak_in_flight"] >= 150, stats


def test_serve_entry_point_in_a_subprocess() -> None:
    port, proc = start_on_free_port(lambda port: subprocess.Popen(
        [sys.executable, "-m", "api_stub", "--port", str(port), "--latency-ms", "10", "--fail-first-n", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/stub/faults").json()["fail_first_n"] == 1
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)
