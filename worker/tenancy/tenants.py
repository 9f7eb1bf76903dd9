"""Tenants and their API keys (stored by worker/store/tenant_records.py), and the policy (plan +
overrides) a tenant's work runs under.

Keys are `rq_<key id>_<secret>` with a 256-bit secret. Only the SHA-256 of the whole key is stored,
and it is compared in constant time. A slow password hash (bcrypt, argon2) protects secrets people
choose, which are guessable; a 256-bit random secret cannot be guessed, so a fast hash loses nothing
and keeps each request's check at microseconds. Every request reads the key's record from Redis (no
in-process cache), so a revocation holds at once on every API process.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from enum import StrEnum

from ..config import Settings
from ..core.tenant_ids import SEPARATOR, TENANT_ID, TENANT_NAME, tenant_name
from ..errors import InvalidRequest
from ..store.tenant_records import TenantStore
from .plans import BUDGET_FIELDS, Budgets, Plan, load_plans

__all__ = ["TENANT_ID", "TENANT_NAME", "KeyStatus", "NewKey", "Policy", "Tenants"]
_KEY = re.compile(r"rq_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")


class KeyStatus(StrEnum):
    VALID = "valid"
    UNKNOWN = "unknown"  # malformed, never issued, or the wrong secret: 401
    REVOKED = "revoked"  # 403


@dataclass(frozen=True)
class Policy:
    """What one tenant may do now: its plan with its own budget overrides applied."""

    tenant: str  # its id (core/tenant_ids.py)
    plan: Plan
    budgets: Budgets

    @property
    def name(self) -> str:
        return tenant_name(self.tenant)

    def check_tier(self, tier: str) -> str | None:
        """None if the plan allows `tier`, else the refusal to show the caller."""
        if tier in self.plan.tiers:
            return None
        return f"tier {tier!r} is not allowed on plan {self.plan.name!r}; allowed tiers: {', '.join(self.plan.tiers)}"


@dataclass(frozen=True)
class NewKey:
    tenant: str
    key_id: str
    key: str


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Tenants:
    """Tenant records and API keys. Tenants named in REACTQ_TENANTS exist without a record and get
    `settings.tenants_plan`; their id is their name. The operator names a tenant (`add`, `resolve`); everything
    else takes its id."""

    def __init__(self, records: TenantStore, settings: Settings, policy_memo_s: float = 0.0) -> None:
        self.records = records
        self.settings = settings
        # A worker asks for a run's policy several times per step; a plan or budget change still
        # applies within this many seconds. Keys are never memoised.
        self.policy_memo_s = policy_memo_s
        self._memo: dict[str, tuple[float, Policy | None]] = {}

    def plans(self) -> dict[str, Plan]:
        return load_plans(self.settings.plans_file, tiers_file=self.settings.sandbox_tiers_file)

    def _plan(self, name: str) -> Plan:
        plans = self.plans()
        if name not in plans:
            raise InvalidRequest(f"unknown plan {name!r}; plans: {', '.join(sorted(plans))}")
        return plans[name]

    # --- tenants ------------------------------------------------------------------------------
    def add(self, name: str, plan: str) -> str:
        """A new tenant named `name`, with an id never used before (a tenant of REACTQ_TENANTS: its name,
        the identity it has had all along); returns the id."""
        if not TENANT_NAME.fullmatch(name):
            raise InvalidRequest(f"invalid tenant name {name!r}: use lowercase letters, digits, '-' and '_' "
                                 "(at most 63, starting with a letter or digit)")
        self._plan(plan)
        tenant_id = name if name in self.settings.tenants else f"{name}{SEPARATOR}{secrets.token_hex(8)}"
        if not self.records.add(tenant_id, name, plan, time.time()):
            raise InvalidRequest(f"tenant {name!r} exists already (change it with `reactq tenant set`)")
        return tenant_id

    def id_of(self, name: str) -> str | None:
        """The id of the tenant named `name` now (an id given as the name: itself), None if there is none."""
        found = self.records.id_of(name)
        return name if found is None and name in self.settings.tenants else found

    def resolve(self, name: str) -> str:
        """`id_of`, or InvalidRequest naming the tenant."""
        tenant_id = self.id_of(name)
        if tenant_id is None:
            raise InvalidRequest(f"unknown tenant {name!r} (add it with `reactq tenant add`, or list it in "
                                 "REACTQ_TENANTS)")
        return tenant_id

    def set(self, name: str, plan: str | None = None, overrides: dict[str, float | None] | None = None) -> None:
        """Change the plan and/or budget overrides (a None value drops an override: the plan's applies)."""
        tenant_id = self.records.id_of(name)
        if tenant_id is None:
            raise InvalidRequest(f"unknown tenant {name!r} (add it with `reactq tenant add`)")
        if plan is not None:
            self._plan(plan)
            self.records.set_field(tenant_id, "plan", plan)
        for field, value in (overrides or {}).items():
            if field not in BUDGET_FIELDS:
                raise InvalidRequest(f"unknown budget {field!r}; budgets: {', '.join(BUDGET_FIELDS)}")
            if value is None:
                self.records.drop_field(tenant_id, field)
            elif value < 0:
                raise InvalidRequest(f"{field} must be 0 (no limit) or more, got {value}")
            else:
                self.records.set_field(tenant_id, field, str(value))

    def remove(self, name: str) -> tuple[str, list[str]]:
        """End a tenant's identity: revoke every API key it has (each is refused from its next request on,
        open event streams and UI sessions included), then drop its record (plan, overrides), its name's
        entry and its webhook URL and secret. A tenant later added with the name gets a new id and sees
        none of this one's data. Its runs and data are left to the caller (`reactq tenant remove`).
        Returns its id and the key ids revoked now. A tenant of REACTQ_TENANTS exists for as long as it
        is listed."""
        tenant_id = self.id_of(name) or (name if self.records.key_ids(name) else None)
        if tenant_id is None:
            raise InvalidRequest(f"unknown tenant {name!r}")
        now = time.time()
        revoked = [k for k in sorted(self.records.key_ids(tenant_id)) if not self.records.key(k).get("revoked_at")]
        for key_id in revoked:
            self.records.revoke_key(key_id, now)
        self.records.remove(tenant_id, keep_webhook=tenant_id in self.settings.tenants)  # still exists
        self._memo.pop(tenant_id, None)
        return tenant_id, revoked

    def ids(self) -> list[str]:
        """Every tenant's id (those of REACTQ_TENANTS included)."""
        return sorted(self.records.ids() | set(self.settings.tenants))

    def names(self) -> list[str]:
        return sorted(tenant_name(i) for i in self.ids())

    def exists(self, tenant_id: str) -> bool:
        return tenant_id in self.settings.tenants or self.records.exists(tenant_id)

    def registered_count(self) -> int:
        """Tenants added with `reactq tenant add`, plus tenants with an API key."""
        return self.records.registered_count()

    def policy(self, name: str) -> Policy | None:
        """The tenant's plan and budgets, or None for a tenant that does not exist."""
        now = time.monotonic()
        memo = self._memo.get(name)
        if memo is not None and now - memo[0] < self.policy_memo_s:
            return memo[1]
        policy = self.policy_from(name, self.records.record(name))
        if self.policy_memo_s:
            self._memo[name] = (now, policy)
        return policy

    def policy_from(self, name: str, raw: dict[str, str]) -> Policy | None:
        if not raw:
            if name not in self.settings.tenants:
                return None
            raw = {"plan": self.settings.tenants_plan}
        plan = self._plan(raw.get("plan", self.settings.tenants_plan))
        overrides = {f: float(raw[f]) for f in BUDGET_FIELDS if f in raw}
        budgets = plan.budgets.model_copy(update={
            f: (int(v) if f.startswith("tokens") else v) for f, v in overrides.items()})
        return Policy(name, plan, budgets)

    def overrides(self, name: str) -> dict[str, str]:
        raw = self.records.record(name)
        return {f: raw[f] for f in BUDGET_FIELDS if f in raw}

    # --- API keys -----------------------------------------------------------------------------
    def create_key(self, name: str) -> NewKey:
        """A key of the tenant named `name` (its record holds the tenant's id)."""
        tenant_id = self.id_of(name)
        if tenant_id is None or not self.exists(tenant_id):
            raise InvalidRequest(f"unknown tenant {name!r} (add it with `reactq tenant add`)")
        key_id = secrets.token_hex(8)
        key = f"rq_{key_id}_{secrets.token_urlsafe(32)}"
        self.records.add_key(tenant_id, key_id, _digest(key), time.time())
        return NewKey(name, key_id, key)

    def create_operator_key(self) -> NewKey:
        """A key for the operator UI (`reactq key create --operator`): it sees every tenant's runs there, and
        authorises no /v1 route (those act for a tenant)."""
        key_id = secrets.token_hex(8)
        key = f"rq_{key_id}_{secrets.token_urlsafe(32)}"
        self.records.add_operator_key(key_id, _digest(key), time.time())
        return NewKey("", key_id, key)

    def list_keys(self, name: str | None) -> list[dict[str, str | None]]:
        """The keys of the tenant named `name`, or (None) the operator keys."""
        out = []
        tenant_id = None if name is None else (self.id_of(name) or name)
        for key_id in sorted(self.records.key_ids(tenant_id) if tenant_id is not None else
                             self.records.operator_key_ids()):
            raw = self.records.key(key_id)
            out.append({"key_id": key_id, "created_at": raw.get("created_at"), "revoked_at": raw.get("revoked_at")})
        return out

    def revoke(self, key_id: str) -> str:
        """Revoke a key; returns its tenant's id ("" for an operator key)."""
        tenant = self.records.key_tenant(key_id) if re.fullmatch(r"[0-9a-f]{16}", key_id) else None
        if tenant is None and re.fullmatch(r"[0-9a-f]{16}", key_id) and self.records.key(key_id).get("operator"):
            tenant = ""  # an operator key
        if tenant is None:
            raise InvalidRequest(f"no API key {key_id!r}")
        self.records.revoke_key(key_id, time.time())
        return tenant

    @staticmethod
    def parse_key(key: str) -> str | None:
        """The key id of a well-formed key, else None."""
        match = _KEY.fullmatch(key)
        return match[1] if match else None

    @staticmethod
    def check(key: str, record: dict[str, str]) -> KeyStatus:
        """Whether `key` matches its stored record (constant-time comparison)."""
        stored = record.get("sha256", "")
        if not stored or not hmac.compare_digest(stored.encode(), _digest(key).encode()):
            return KeyStatus.UNKNOWN
        return KeyStatus.REVOKED if record.get("revoked_at") else KeyStatus.VALID
