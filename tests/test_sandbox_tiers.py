"""Pure tests: tiers file, public API, wire-format parser (no Docker, no Redis)."""

from __future__ import annotations

import json
import struct

import pytest

import tools_sandbox
from tools_sandbox import SandboxError, SandboxResult, load_tiers, run_code
from tools_sandbox.base.config import DEFAULT_TIERS_FILE
from tools_sandbox.base.errors import TierConfigError, UnknownTierError
from tools_sandbox.base.protocol import ExitRecord, FrameParser, encode_request, interpret_exit
from tools_sandbox.base.tiers import get_tier, parse_tiers, requiring_runtime


def test_public_api_is_all() -> None:
    for name in tools_sandbox.__all__:
        assert hasattr(tools_sandbox, name), name
    assert {"SandboxResult", "run_code", "SandboxError", "load_tiers"} <= set(tools_sandbox.__all__)


def test_result_has_contract_fields_plus_backend() -> None:
    contract = {"exit_code", "stdout", "stderr", "timed_out", "oom_killed", "truncated", "duration_ms",
                "tier", "error", "error_kind", "backend"}
    # Plus the host's measurements (which the quota is charged with).
    assert set(SandboxResult.model_fields) == contract | {"cpu_seconds", "memory_peak_bytes"}


def test_shipped_tiers_file_loads_and_is_ordered() -> None:
    tiers = load_tiers()
    assert {"free", "standard", "pro"} <= set(tiers)
    free, std, pro = tiers["free"], tiers["standard"], tiers["pro"]
    for field in ("cpus", "memory_mb", "wall_time_s", "pids", "output_bytes", "tmpfs_mb"):
        assert getattr(free, field) <= getattr(std, field) <= getattr(pro, field), field


def test_unknown_tier_names_known_tiers() -> None:
    tiers = load_tiers()
    with pytest.raises(UnknownTierError) as err:
        get_tier("gold", tiers)
    assert isinstance(err.value, SandboxError)
    assert "gold" in str(err.value) and "free" in str(err.value) and "standard" in str(err.value)


def test_run_code_unknown_tier_raises_before_any_io() -> None:
    with pytest.raises(UnknownTierError):
        run_code("print(1)", tier="nope", backend="docker", redis_url="redis://127.0.0.1:1/0")


@pytest.mark.parametrize("text, fragment", [
    ("[tiers.x]\ncpus = 1\n", "invalid"),
    ("not toml [", "invalid TOML"),
    ("[other]\na = 1\n", r"no \[tiers"),
    ("[tiers.x]\ncpus = -1\nmemory_mb = 64\nwall_time_s = 1\ncpu_time_s = 1\npids = 8\n"
     "output_bytes = 2048\ntmpfs_mb = 1\n[tiers.x.quota]\nconcurrent_executions = 1\n"
     "executions_per_minute = 1\ncpu_seconds_per_day = 1\n", "invalid"),
    ("[tiers.x]\ncpus = 1\nmemory_mb = 64\nwall_time_s = 1\ncpu_time_s = 1\npids = 8\n"
     "output_bytes = 2048\ntmpfs_mb = 1\nprivileged = true\n[tiers.x.quota]\nconcurrent_executions = 1\n"
     "executions_per_minute = 1\ncpu_seconds_per_day = 1\n", "invalid"),
])
def test_invalid_tiers_rejected(text: str, fragment: str) -> None:
    with pytest.raises(TierConfigError, match=fragment):
        parse_tiers(text)


RECORD = {"exit_code": 0, "signal": None, "cpu_s": 0.01, "oom_kills": 0, "truncated": False, "memory_error": False}


def _frame(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


def test_parser_caps_each_stream_and_reassembles_split_frames() -> None:
    parser = FrameParser(cap=10)
    data = _frame(b"1", b"hello ") + _frame(b"2", b"err") + _frame(b"1", b"world, long") + _frame(
        b"X", json.dumps(RECORD).encode())
    for i in range(len(data)):  # one byte at a time
        parser.feed(data[i:i + 1])
    assert bytes(parser.stdout) == b"hello worl"
    assert bytes(parser.stderr) == b"err"
    assert parser.truncated and parser.exit == ExitRecord(**RECORD)


def test_parser_memory_stays_flat_under_a_hostile_huge_frame() -> None:
    parser = FrameParser(cap=1024)
    parser.feed(b"1" + struct.pack(">I", 2**32 - 1))
    chunk = b"x" * 65536
    for _ in range(200):  # 13 MB claimed by one frame
        parser.feed(chunk)
    assert len(parser.stdout) == 1024 and parser.truncated


def test_parser_rejects_garbage() -> None:
    parser = FrameParser(cap=1024)
    parser.feed(b"Zgarbage")
    assert parser.protocol_error
    parser = FrameParser(cap=1024)
    parser.feed(b"X" + struct.pack(">I", 10**6))
    assert parser.protocol_error


def test_request_is_printable_ascii() -> None:
    tier = load_tiers()["free"]
    req = encode_request("print('\x10\x11 ünïcode')", tier)
    assert all(32 <= b < 127 or b == 10 for b in req)


def test_exit_interpretation() -> None:
    tier = load_tiers()["free"]
    def rec(**kw):
        return ExitRecord(**{**RECORD, **kw})

    assert interpret_exit(rec(exit_code=3), tier, None).exit_code == 3
    cpu = interpret_exit(rec(exit_code=None, signal=24, cpu_s=3.0), tier, None)
    assert cpu.cpu_limited and cpu.exit_code == 152
    killed = interpret_exit(rec(exit_code=None, signal=9, cpu_s=0.1), tier, None)
    assert killed.killed_by_sigkill and not killed.cpu_limited
    # The host's CPU figure decides, not the agent's claim.
    lied = interpret_exit(rec(exit_code=None, signal=9, cpu_s=0.0), tier, float(tier.cpu_time_s))
    assert lied.cpu_limited


def test_tools_sandbox_never_imports_worker() -> None:
    import pathlib

    root = pathlib.Path(tools_sandbox.__file__).parent
    for path in root.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "import worker" not in text and "from worker" not in text, path


def test_a_tiers_file_can_be_made_to_require_a_runtime() -> None:
    text = DEFAULT_TIERS_FILE.read_text(encoding="utf-8")
    shipped, on_gvisor = parse_tiers(text), parse_tiers(requiring_runtime(text, "runsc"))
    assert set(on_gvisor) == set(shipped) and {t.runtime for t in on_gvisor.values()} == {"runsc"}
    assert all(on_gvisor[n].quota == shipped[n].quota for n in shipped)  # the quota tables are untouched
    assert requiring_runtime(text, "runc") == text
