"""MCP servers as tool sources, against real servers nobody here wrote (the npm packages
@modelcontextprotocol/server-everything and server-filesystem, installed by scripts/test.sh from
tests/assets/mcp/package-lock.json), through the official `mcp` SDK: their tools as the model sees
them, calls through the real step path (validation, deadline, metrics, the observation limit, the
durability of tools with effects), content the model cannot read, plans, and a server's HTTP mode
behind the webhooks' address checks. tests/test_mcp_worker.py runs them on real Celery workers."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.fixtures_services import start_on_free_port
from tests.harness import Harness, call, final
from tests.waiting import wait_for
from worker import metrics
from worker.config import McpServerSpec, Settings
from worker.core.outcome import Outcome
from worker.runtime import approvals
from worker.runtime.mcp import McpTool, McpTools
from worker.runtime.mcp.sessions import _transport_closed as transport_closed
from worker.runtime.mcp.toolset import ToolsWithMcp
from worker.tenancy.plans import AllowedTools, Plan, PlanLimits
from worker.tools import REGISTRY

SERVERS = Path(__file__).parent / "assets" / "mcp" / "node_modules" / "@modelcontextprotocol"
EVERYTHING = SERVERS / "server-everything" / "dist" / "index.js"
FILESYSTEM = SERVERS / "server-filesystem" / "dist" / "index.js"


def everything(**fields: Any) -> dict[str, Any]:
    return {"command": ["node", str(EVERYTHING), "stdio"], **fields}


@pytest.fixture
def mcp_harness(make_harness: Callable[..., Harness]) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(servers: dict[str, dict[str, Any]], **overrides: Any) -> Harness:
        harness = make_harness(mcp_servers=servers, **overrides)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        if harness.rt.mcp is not None:
            harness.rt.mcp.close()


def offered(harness: Harness, tenant: str = "default") -> dict[str, Any]:
    return {t.name: t for t in harness.rt.tools_for(tenant).all()}


def test_a_servers_tools_are_offered_with_their_names_descriptions_and_schemas(mcp_harness) -> None:
    harness = mcp_harness({"everything": everything()})
    tools = offered(harness)
    assert {"calculator", "search", "echo", "get-sum", "get-tiny-image"} <= set(tools)
    schema = tools["echo"].openai_schema()["function"]
    assert schema["description"] == "Echoes back the input string"
    assert schema["parameters"]["properties"]["message"]["type"] == "string"
    assert schema["parameters"]["required"] == ["message"] and "$schema" not in schema["parameters"]


def test_names_that_clash_get_their_servers_name_before_them(mcp_harness) -> None:
    """Two servers with the same tools: each tool under `server_tool`; a name still ends with the
    server's own tool name, and the registry's tools keep theirs."""
    harness = mcp_harness({"one": everything(), "two": everything()})
    names = set(offered(harness))
    assert {"one_echo", "two_echo", "one_get-sum", "two_get-sum", "calculator"} <= names
    assert "echo" not in names


def test_a_call_goes_through_the_step_path_and_is_counted(mcp_harness) -> None:
    harness = mcp_harness({"everything": everything()})
    ok = metrics.TOOL_CALLS.labels("get-sum", "ok")._value.get()
    harness.llm.script(call("get-sum", {"a": 17, "b": 25}), final("42"))
    run_id = harness.submit("What is 17 + 25?")
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    [obs] = harness.steps(run_id)[0].observations
    assert (obs.tool, obs.outcome) == ("get-sum", "ok") and "42" in obs.content
    assert metrics.TOOL_CALLS.labels("get-sum", "ok")._value.get() == ok + 1


def test_arguments_are_checked_against_the_servers_schema_before_any_call(mcp_harness) -> None:
    harness = mcp_harness({"everything": everything()})
    harness.llm.script(call("get-sum", {"a": "seventeen"}), final("?"))
    run_id = harness.submit("What is 17 + 25?")
    harness.drain()
    [obs] = harness.steps(run_id)[0].observations
    assert obs.outcome == "invalid_arguments", obs
    assert "invalid arguments for get-sum" in obs.content and "Expected JSON like" in obs.content


def test_images_and_resources_become_text_that_says_what_was_left_out(mcp_harness) -> None:
    harness = mcp_harness({"everything": everything()})
    harness.llm.script(call("get-tiny-image", {}, call_id="i"), call("get-resource-links", {"count": 2}, call_id="r"),
                       final("done"))
    run_id = harness.submit("Show me the image and two resources")
    harness.drain()
    image, links = (s.observations[0].content for s in harness.steps(run_id)[:2])
    assert "[an image (image/png, " in image and "was left out" in image and "MCP logo" in image
    assert "data:" not in image and "iVBOR" not in image  # no base64 reaches the model
    assert links.count("[a link to resource demo://") == 2


def test_a_long_observation_is_cut_to_the_observation_limit(mcp_harness) -> None:
    harness = mcp_harness({"everything": everything()}, observation_max_chars=200)
    harness.llm.script(call("echo", {"message": "x" * 5000}), final("done"))
    run_id = harness.submit("Echo a lot")
    harness.drain()
    [obs] = harness.steps(run_id)[0].observations
    assert obs.content.startswith("Echo: xxx") and len(obs.content) < 400


def test_a_hung_call_costs_its_deadline_and_the_next_call_gets_a_fresh_server(mcp_harness) -> None:
    harness = mcp_harness({"everything": everything(timeout_s=5)})
    harness.llm.script(call("trigger-long-running-operation", {"duration": 600, "steps": 2}, call_id="slow"),
                       call("echo", {"message": "still here"}, call_id="e"), final("done"))
    run_id = harness.submit("Run the long operation, then echo")
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    slow, echoed = (s.observations[0] for s in harness.steps(run_id)[:2])
    assert slow.outcome == "timeout" and "took longer than 5 s" in slow.content, slow
    assert (echoed.outcome, echoed.content) == ("ok", "Echo: still here")
    assert harness.rt.mcp is not None and harness.rt.mcp.starts("everything") == 2


def server_pids(parent_pid: int | None = None) -> set[int]:
    """The server-everything processes under `parent_pid` (default: this process)."""
    try:
        children = psutil.Process(parent_pid).children(recursive=True)
    except psutil.Error:
        return set()
    found = set()
    for child in children:
        try:
            if str(EVERYTHING) in " ".join(child.cmdline()):
                found.add(child.pid)
        except psutil.Error:
            continue
    return found


def test_a_server_that_died_between_calls_is_started_again_for_the_next(mcp_harness) -> None:
    harness = mcp_harness({"everything": everything()})
    before = server_pids()
    offered(harness)
    [server] = server_pids() - before  # an earlier test's server may still be on its way out
    psutil.Process(server).kill()
    hub = harness.rt.mcp
    assert hub is not None
    wait_for("the connection to see its server gone",
             lambda: transport_closed(hub._connections["everything"]._session), 30)
    harness.llm.script(call("echo", {"message": "again"}), final("done"))
    run_id = harness.submit("Echo again")
    harness.drain()
    assert harness.steps(run_id)[0].observations[0].content == "Echo: again"
    assert hub.starts("everything") == 2


def test_a_redelivered_step_never_calls_the_server_twice(mcp_harness) -> None:
    """toggle-simulated-logging flips a state of the server's session: the worker dies right after the
    call's result was stored; the redelivered step reuses it, so the server saw one call (a second
    toggle now says "Started" again only if the first one was the only one)."""
    harness = mcp_harness({"everything": everything()})
    scratch = harness.store.scratch
    save = scratch.save_tool_result

    def save_then_die(*args: Any, **kwargs: Any) -> Any:
        save(*args, **kwargs)
        raise SystemExit("the worker died")

    harness.llm.script(call("toggle-simulated-logging", {}), final("toggled"))
    run_id = harness.submit("Toggle the logging")
    scratch.save_tool_result = save_then_die  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        harness.step()
    scratch.save_tool_result = save  # type: ignore[method-assign]
    harness.deliver(run_id, 0)
    harness.drain()
    assert harness.run(run_id).answer == "toggled"
    assert harness.steps(run_id)[0].observations[0].content.startswith("Started simulated")
    assert harness.rt.mcp is not None
    assert harness.rt.mcp.call("everything", "toggle-simulated-logging", {}, 10).startswith("Stopped")


def test_a_call_named_in_the_approval_tools_waits_for_a_person(mcp_harness) -> None:
    """Not run until approved: toggle-simulated-logging, approved, says "Started" (its first call)."""
    harness = mcp_harness({"everything": everything()}, approval_tools=["toggle-simulated-logging"])
    harness.llm.script(call("toggle-simulated-logging", {}), final("toggled"))
    run_id = harness.submit("Toggle the logging")
    assert harness.drain() == [Outcome.AWAITING_APPROVAL]
    [pending] = harness.run(run_id).approvals
    assert pending.tool == "toggle-simulated-logging" and pending.decision is None
    approvals.record_decision(harness.store, run_id, pending.call_id, True, "test", None, harness.dispatch.next_step)
    assert harness.drain() == [Outcome.TOOL_CALLS, Outcome.FINAL_ANSWER]
    assert harness.steps(run_id)[0].observations[0].content.startswith("Started simulated")


def test_a_stdio_server_gets_its_env_and_none_of_the_workers_settings(mcp_harness) -> None:
    os.environ["REACTQ_TEST_WORKER_SECRET"] = "worker-only"
    try:
        harness = mcp_harness({"everything": everything(env={"SERVER_TOKEN": "s3cret"})})
        offered(harness)
        assert harness.rt.mcp is not None
        env = json.loads(harness.rt.mcp.call("everything", "get-env", {}, 10))
    finally:
        del os.environ["REACTQ_TEST_WORKER_SECRET"]
    assert env["SERVER_TOKEN"] == "s3cret"
    assert not [k for k in env if k.startswith("REACTQ_")]


def test_the_filesystem_server_reads_only_what_it_was_given(mcp_harness, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the launch code is 0000")
    harness = mcp_harness({"fs": {"command": ["node", str(FILESYSTEM), str(tmp_path)]}})
    harness.llm.script(call("read_text_file", {"path": str(tmp_path / "notes.txt")}, call_id="ok"),
                       call("read_text_file", {"path": "/etc/hostname"}, call_id="out"), final("done"))
    run_id = harness.submit("Read my notes")
    harness.drain()
    inside, outside = (s.observations[0] for s in harness.steps(run_id)[:2])
    assert (inside.outcome, inside.content) == ("ok", "the launch code is 0000")
    assert outside.outcome == "error" and "Access denied" in outside.content, outside


def test_a_plan_gets_the_servers_it_names() -> None:
    hub = McpTools({"one": McpServerSpec(**everything()), "two": McpServerSpec(**everything())}, timeout_s=10)
    limits = PlanLimits(runs_in_flight=1, submissions_per_minute=1, sse_streams=1)
    try:
        tools = ToolsWithMcp(REGISTRY, hub)
        only_one = AllowedTools(tools, Plan(name="p", tiers=["free"], tools=["calculator"], mcp_servers=["one"],
                                            limits=limits))
        none = AllowedTools(tools, Plan(name="q", tiers=["free"], limits=limits))
        assert not [t for t in none.all() if isinstance(t, McpTool)] and none.get("one_echo") is None
        assert hub.listed() == []  # a plan without servers starts none
        servers = {t.server for t in only_one.all() if isinstance(t, McpTool)}
        assert servers == {"one"} and "calculator" in only_one.names() and "search" not in only_one.names()
        assert only_one.get("two_echo") is None and only_one.get("one_echo") is not None
        refusal = only_one.refusal("two_echo")
        assert refusal is not None and "not allowed on this tenant's plan" in refusal
    finally:
        hub.close()


# --- HTTP ----------------------------------------------------------------------------------------

@pytest.fixture
def http_server() -> Iterator[str]:
    port, proc = start_on_free_port(lambda port: subprocess.Popen(
        ["node", str(EVERYTHING), "streamableHttp"], env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), 60)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(10)


def test_an_http_server_is_called_with_its_headers(mcp_harness, http_server: str) -> None:
    harness = mcp_harness({"remote": {"url": http_server, "headers": {"Authorization": "Bearer t"},
                                      "allow_private": True}})
    harness.llm.script(call("echo", {"message": "over http"}), final("done"))
    run_id = harness.submit("Echo over HTTP")
    harness.drain()
    assert harness.steps(run_id)[0].observations[0].content == "Echo: over http"


def test_an_http_server_at_a_private_address_is_refused_like_a_webhook(mcp_harness, http_server: str) -> None:
    """Without allow_private (or REACTQ_WEBHOOK_ALLOW_PRIVATE) a loopback server is never connected to:
    its tools are not offered, and a call to one is an unknown tool."""
    harness = mcp_harness({"remote": {"url": http_server}})
    assert not [t for t in offered(harness).values() if isinstance(t, McpTool)]
    harness.llm.script(call("echo", {"message": "x"}), final("done"))
    run_id = harness.submit("Echo")
    harness.drain()
    [obs] = harness.steps(run_id)[0].observations
    assert obs.outcome != "ok" and "Echo" not in obs.content


def test_an_entry_is_a_command_or_a_url() -> None:
    with pytest.raises(ValueError, match="either a command or a url"):
        Settings(mcp_servers={"x": {"command": ["a"], "url": "https://example.com/mcp"}})
    with pytest.raises(ValueError):
        Settings(mcp_servers={"bad name!": {"command": ["a"]}})
    with pytest.raises(ValueError, match="http or https"):
        Settings(mcp_servers={"x": {"url": "file:///etc/passwd"}})
    assert Settings(mcp_servers={"ok": {"url": "https://example.com/mcp"}}).mcp_servers["ok"].start_timeout_s == 30
