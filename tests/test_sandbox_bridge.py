"""A stored sandbox result object (the contract's shape) turned into the observation the model sees."""

from __future__ import annotations

import json

import pytest

from tools_sandbox.base.render import PROTOCOL_VIOLATION_TEXT, STDERR_TAIL_LINES, UNAVAILABLE_TEXT, render
from worker.core.engine import UNAVAILABLE_OUTCOME
from worker.runtime.sandbox_bridge import UNREADABLE, observation_from_sandbox


def result(**kw) -> str:
    base = {"exit_code": 0, "stdout": "", "stderr": "", "timed_out": False, "oom_killed": False,
            "truncated": False, "duration_ms": 12, "tier": "standard", "error": None, "backend": "process"}
    base.update(kw)
    return json.dumps(base)


def observe(**kw):
    return observation_from_sandbox("call-1", "python", result(**kw))


def test_ok_output():
    obs, error_type = observe(stdout="42\n", stderr="", duration_ms=87)
    assert error_type is None
    assert obs.call_id == "call-1" and obs.tool == "python"
    assert obs.outcome == "ok"
    assert obs.content == "42"
    assert obs.duration_ms == 87


def test_ok_output_hides_stderr_noise():
    obs, error_type = observe(stdout="42", stderr="DeprecationWarning: x")
    assert error_type is None
    assert obs.content == "42"


def test_ok_without_stdout_shows_stderr():
    obs, error_type = observe(stdout="", stderr="a warning\n")
    assert error_type is None
    assert obs.content == "stderr: a warning"


def test_bytes_are_accepted():
    obs, _ = observation_from_sandbox("c", "python", result(stdout="hi").encode())
    assert obs.content == "hi"


def test_nonzero_exit_shows_output_exit_code_and_stderr_tail():
    stderr = "\n".join(f"line {i}" for i in range(50)) + "\nZeroDivisionError: division by zero\n"
    obs, error_type = observe(exit_code=1, stdout="partial", stderr=stderr)
    assert error_type == "exit_code"
    assert obs.outcome == "error"
    lines = obs.content.split("\n")
    assert lines[0] == "partial"
    assert lines[1] == "exit code 1"
    assert lines[2].startswith("stderr: ")
    assert obs.content.endswith("ZeroDivisionError: division by zero")
    tail = obs.content.split("stderr: ", 1)[1].split("\n")
    assert len(tail) == STDERR_TAIL_LINES
    assert "line 29" not in tail and tail[0] == "line 31"


def test_timeout():
    obs, error_type = observe(timed_out=True, exit_code=None, stdout="started", tier="small", error_kind="timeout")
    assert error_type == "timeout"
    assert obs.outcome == "error"
    assert obs.content.startswith("Error: the code was stopped at the time limit of its tier (small).")
    assert "started" in obs.content


def test_oom():
    obs, error_type = observe(oom_killed=True, exit_code=137, stderr="Killed", tier="standard", error_kind="oom")
    assert error_type == "oom"
    assert obs.outcome == "error"
    assert obs.content.startswith("Error: the code ran out of memory (tier standard).")
    assert "stderr: Killed" in obs.content


def test_quota_error():
    error = "quota_exceeded: concurrent for tenant acme on tier standard; limit 2"
    obs, error_type = observe(exit_code=None, error=error, error_kind="quota_exceeded")
    assert error_type == "quota_exceeded"
    assert obs.outcome == "quota"
    assert obs.content == f"Error: {error}"
    assert "exit code" not in obs.content


@pytest.mark.parametrize(
    ("error", "kind", "error_type"),
    [("unknown_tier: 'x'", "unknown_tier", "unknown_tier"), (": odd", None, "sandbox_error")],
)
def test_other_sandbox_errors(error, kind, error_type):
    obs, got = observe(exit_code=None, error=error, stderr="agent trace", error_kind=kind)
    assert got == error_type
    assert obs.outcome == "error"
    assert obs.content.startswith(f"Error: {error}")
    assert "stderr: agent trace" in obs.content


def test_an_unavailable_result_is_not_for_the_model():
    """Whatever the stored error says, the observation is fixed words, with the outcome that ends the run."""
    obs, error_type = observe(exit_code=None, error="sandbox_unavailable: Error while fetching (FileNotFoundError)",
                              stderr="Traceback", error_kind="unavailable")
    assert error_type == "unavailable"
    assert obs.outcome == UNAVAILABLE_OUTCOME
    assert obs.content == UNAVAILABLE_TEXT and "Error while" not in obs.content and "Traceback" not in obs.content


def test_error_wins_over_timeout_flags():
    obs, error_type = observe(error="quota_exceeded: cpu", timed_out=True, oom_killed=True,
                              error_kind="quota_exceeded")
    assert error_type == "quota_exceeded"
    assert "time limit" not in obs.content and "memory" not in obs.content


def test_truncated_marker():
    obs, error_type = observe(stdout="x" * 100, truncated=True)
    assert error_type is None
    assert obs.outcome == "ok"
    assert obs.content == "x" * 100 + "\n…[output truncated at the tier's byte cap]"


def test_empty_output():
    obs, error_type = observe()
    assert error_type is None
    assert obs.content == "(no output; print() the result)"


@pytest.mark.parametrize("raw", [
    json.dumps({"stdout": None, "stderr": None}), "1", "[" * 5000, "{not json",
    result(exit_code="a"), result(error_kind="made_up"), result(surprise=1), result(duration_ms=-5),
])
def test_a_stored_result_that_does_not_validate_is_one_clear_error(raw):
    obs, error_type = observation_from_sandbox("c", "python", raw)
    assert (obs.content, obs.outcome, error_type) == (UNREADABLE, "error", "unreadable_result")


def test_protocol_violation_is_one_sentence_and_nothing_else():
    obs, error_type = observe(exit_code=None, stdout="forged 42", stderr="Traceback: AttributeError",
                              error="the program interfered", error_kind="protocol_violation")
    assert obs.content == PROTOCOL_VIOLATION_TEXT
    assert error_type == "protocol_violation" and obs.outcome == "error"


def test_output_limit_is_shown_but_not_a_failure():
    obs, error_type = observe(stdout="x" * 10, truncated=True, exit_code=None, error_kind="output_limit")
    assert error_type is None and obs.outcome == "ok"
    assert obs.content.endswith("[output truncated at the tier's byte cap]")


def test_the_sandbox_cli_and_the_bridge_show_the_same_text():
    from tools_sandbox import SandboxResult

    raw = result(exit_code=1, stdout="partial", stderr="boom")
    via_bridge = observation_from_sandbox("c", "python", raw)[0].content
    assert render(SandboxResult.model_validate_json(raw)).text == via_bridge
