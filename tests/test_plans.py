"""Plans, the run's own budget arithmetic, budget periods and key checks: the pure parts of tenancy."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from worker.core.models import Run, RunSpec, Usage
from worker.errors import BudgetExceeded, PlanConfigError
from worker.store.spend import periods
from worker.tenancy.budgets import call_max_tokens
from worker.tenancy.ledger import next_day, next_month
from worker.tenancy.plans import AllowedTools, load_plans, parse_plans
from worker.tenancy.tenants import KeyStatus, Tenants, _digest
from worker.tools import REGISTRY

PRICES = {"m": (1.0, 2.0)}  # USD per million prompt / completion tokens


def test_shipped_plans_allow_the_tier_of_their_name_and_those_below() -> None:
    plans = load_plans()
    assert plans["free"].tiers == ["free"]
    assert plans["standard"].tiers == ["free", "standard"]
    assert plans["pro"].tiers == ["free", "standard", "pro"]
    assert [plans[p].default_tier for p in ("free", "standard", "pro", "operator")] == [
        "free", "standard", "pro", "standard"]
    assert not plans["free"].allows_tool("python") and plans["standard"].allows_tool("python")
    assert plans["pro"].allows_tool("anything-registered-later")
    assert all(p.approval_required == [] for p in plans.values())
    assert plans["operator"].budgets.tokens_per_day == 0  # no limit for REACTQ_TENANTS tenants


@pytest.mark.parametrize("text, problem", [
    ("[plans.x]\ntiers = []\n[plans.x.limits]\nruns_in_flight = 1\nsubmissions_per_minute = 1\nsse_streams = 1",
     "tiers"),
    ("[plans.x]\ntiers = ['free']\ndefault_tier = 'pro'\n[plans.x.limits]\nruns_in_flight = 1\n"
     "submissions_per_minute = 1\nsse_streams = 1", "default_tier 'pro' is not one of its tiers"),
    ("[plans.x]\ntiers = ['free']\nbogus = 1\n[plans.x.limits]\nruns_in_flight = 1\nsubmissions_per_minute = 1\n"
     "sse_streams = 1", "bogus"),
    ("[plans.x]\ntiers = ['free']", "limits"),
    ("nothing = 1", "no [plans.<name>] tables"),
    ("[plans", "invalid TOML"),
])
def test_a_bad_plans_file_is_named_precisely(text: str, problem: str) -> None:
    with pytest.raises(PlanConfigError, match="plans.toml") as caught:
        parse_plans(text, "plans.toml")
    assert problem in str(caught.value)


def _run(**spec: object) -> Run:
    return Run(spec=RunSpec(question="q", **spec), model="m")  # type: ignore[arg-type]


def test_a_call_gets_what_the_run_budget_leaves() -> None:
    assert call_max_tokens(_run(), 500, 1024, 0, PRICES) == 1024
    run = _run(max_tokens=2000)
    run.usage = Usage(prompt_tokens=900, completion_tokens=100)
    assert call_max_tokens(run, 500, 1024, 0, PRICES) == 500  # 2000 - 1000 spent - 500 of prompt
    assert call_max_tokens(run, 500, 1024, 1800, PRICES) == 300  # the global cap is lower still
    with pytest.raises(BudgetExceeded, match=r"max_tokens=2000\): 1000 tokens used; the next call needs up to 1006"):
        call_max_tokens(run, 990, 1024, 0, PRICES)


def test_a_call_gets_what_the_run_cost_budget_leaves() -> None:
    run = _run(max_cost_usd=0.002)
    run.cost_usd = 0.0005
    # 0.002 - 0.0005 - 500 prompt tokens at $1/M = $0.001 left; at $2/M that is 500 completion tokens
    assert call_max_tokens(run, 500, 1024, 0, PRICES) == 500
    run.cost_usd = 0.00148
    with pytest.raises(BudgetExceeded, match=r"max_cost_usd=0.002"):
        call_max_tokens(run, 500, 1024, 0, PRICES)


def test_budget_periods_are_utc_days_and_calendar_months() -> None:
    t = datetime(2024, 2, 29, 23, 59, 30, tzinfo=UTC).timestamp()
    assert periods(t) == ("d:2024-02-29", "m:2024-02")
    assert next_day(t) == datetime(2024, 3, 1, tzinfo=UTC).timestamp()
    assert next_month(t) == datetime(2024, 3, 1, tzinfo=UTC).timestamp()
    assert next_month(datetime(2024, 12, 5, tzinfo=UTC).timestamp()) == datetime(2025, 1, 1, tzinfo=UTC).timestamp()


def test_keys_match_only_their_own_hash() -> None:
    key = "rq_0123456789abcdef_" + "k" * 43
    assert Tenants.parse_key(key) == "0123456789abcdef"
    assert Tenants.parse_key("rq_0123456789abcdef_short") is None and Tenants.parse_key("Bearer x") is None
    record = {"tenant": "t", "sha256": _digest(key)}
    assert Tenants.check(key, record) == KeyStatus.VALID
    assert Tenants.check(key[:-1] + "j", record) == KeyStatus.UNKNOWN
    assert Tenants.check(key, {}) == KeyStatus.UNKNOWN
    assert Tenants.check(key, {**record, "revoked_at": "1"}) == KeyStatus.REVOKED


def test_a_plan_sees_only_its_tools() -> None:
    import worker.tools.builtin  # noqa: F401 - registers the built-in tools

    free = AllowedTools(REGISTRY, load_plans()["free"])
    assert free.names() == ["calculator", "search"] and [t.name for t in free.all()] == ["calculator", "search"]
    assert free.get("python") is None and free.get("Calculator") is not None
    assert free.refusal("python") == ("tool 'python' is not allowed on this tenant's plan ('free'); "
                                      "available tools: calculator, search")
    assert free.refusal("calculator") is None and free.refusal("no-such-tool") is None


# --- budget estimates of multi-byte text ------------------------------------------------------

def test_an_estimate_counts_utf8_bytes_of_non_ascii_text() -> None:
    from worker.tenancy.budgets import estimate_text_tokens

    assert estimate_text_tokens("a" * 100) == 40  # ASCII: characters / 2.5, as before
    chinese = "你好世界" * 25  # 100 characters of 3 bytes: a byte-level BPE may emit 300 tokens
    assert estimate_text_tokens(chinese) == 300
    emoji = "🙂" * 100  # 4 bytes each
    assert estimate_text_tokens(emoji) == 400
    assert estimate_text_tokens("ab🙂") == 0 + 4  # 2 ASCII characters round down to 0, the emoji is 4
    assert estimate_text_tokens("\ud800") == 3  # a lone surrogate is counted, not an error


def test_a_budget_reservation_is_no_smaller_than_the_text_could_tokenise_to() -> None:
    from worker.tenancy.budgets import estimate_prompt_tokens

    for text in ("你好世界" * 500, "🙂🎉" * 500, "привет" * 200):
        messages = [{"role": "user", "content": text}]
        assert estimate_prompt_tokens(messages, {}) >= len(text.encode("utf-8")) * 0.99  # at most a token a byte
    ascii_messages = [{"role": "user", "content": "x" * 2000}]
    assert estimate_prompt_tokens(ascii_messages, {}) < 2000  # ASCII is not over-reserved 2.5x


# --- tiers = ["*"]: every tier of the tiers file ---------------------------------------------------

def test_the_operator_plan_allows_a_tier_added_to_the_tiers_file(tmp_path, monkeypatch) -> None:
    from tests.fixtures_sandbox import tier_toml
    from tools_sandbox.base.config import DEFAULT_TIERS_FILE
    from worker.config import Settings
    from worker.core.models import RunSpec
    from worker.service.submit import validate_spec
    from worker.tenancy.plans import known_tiers
    from worker.tenancy.tenants import Policy

    tiers_file = tmp_path / "tiers.toml"
    tiers_file.write_text(DEFAULT_TIERS_FILE.read_text() + tier_toml("gpu", (2, 10, 100.0)))
    monkeypatch.setenv("REACTQ_SANDBOX_TIERS_FILE", str(tiers_file))
    settings = Settings()  # the setting reaches the plans through what the tenants pass: load_plans's tiers_file
    assert settings.sandbox_tiers_file == str(tiers_file)
    plans = load_plans(tiers_file=settings.sandbox_tiers_file)
    assert plans["operator"].tiers[-1] == "gpu" and {"free", "standard", "pro"} <= set(plans["operator"].tiers)
    assert "gpu" not in plans["pro"].tiers  # a plan that names its tiers gets only those
    operator = Policy("ops", plans["operator"], plans["operator"].budgets)
    assert operator.check_tier("gpu") is None
    validate_spec(RunSpec(question="q", tenant="ops", tier="gpu"), settings, known_tiers(settings), policy=operator)
    assert "not allowed" in (Policy("p", plans["pro"], plans["pro"].budgets).check_tier("gpu") or "")
    assert "gpu" not in load_plans()["operator"].tiers  # without it: the shipped tiers file

    tiers_file.write_text(DEFAULT_TIERS_FILE.read_text())  # the tier removed again: gone from the plan too
    import os
    os.utime(tiers_file, ns=(1, 1))
    assert "gpu" not in load_plans()["operator"].tiers


@pytest.mark.parametrize("tiers, default, problem", [
    ('["*"]', None, 'names its default_tier'),
    ('["*", "free"]', "free", 'stands alone'),
])
def test_every_tier_needs_a_default_and_stands_alone(tiers: str, default: str | None, problem: str) -> None:
    text = (f"[plans.x]\ntiers = {tiers}\n" + (f"default_tier = {default!r}\n".replace("'", '"') if default else "")
            + "[plans.x.limits]\nruns_in_flight = 1\nsubmissions_per_minute = 1\nsse_streams = 1")
    with pytest.raises(PlanConfigError, match=problem):
        parse_plans(text, "plans.toml")


def test_every_tier_with_a_default_the_tiers_file_lacks_is_named() -> None:
    text = ('[plans.x]\ntiers = ["*"]\ndefault_tier = "huge"\n'
            "[plans.x.limits]\nruns_in_flight = 1\nsubmissions_per_minute = 1\nsse_streams = 1")
    with pytest.raises(PlanConfigError, match="default_tier 'huge' is not one of its tiers"):
        parse_plans(text, "plans.toml", tiers=["free", "pro"])
    assert parse_plans(text.replace("huge", "pro"), "plans.toml", tiers=["free", "pro"])["x"].tiers == ["free", "pro"]
