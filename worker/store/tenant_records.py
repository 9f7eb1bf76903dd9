"""Tenant records and API key records (worker/tenancy/tenants.py decides what goes in them: plans,
overrides, key format and hashing). Values cross as plain strings: the store knows no plan or policy."""

from __future__ import annotations

import redis

from . import keys
from .connection import text_fields


class TenantStore:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    # --- tenants ------------------------------------------------------------------------------
    def add(self, name: str, plan: str, created_at: float) -> bool:
        """Record a new tenant on `plan`; False (nothing written) if it exists already."""
        if not self.r.hsetnx(keys.tenant(name), "plan", plan):
            return False
        self.r.hset(keys.tenant(name), "created_at", str(created_at))
        self.r.sadd(keys.TENANTS, name)
        return True

    def exists(self, name: str) -> bool:
        return bool(self.r.exists(keys.tenant(name)))

    def record(self, name: str) -> dict[str, str]:
        """A tenant's record: plan, created_at, budget overrides (empty: no record)."""
        return text_fields(self.r.hgetall(keys.tenant(name)))

    def set_field(self, name: str, field: str, value: str) -> None:
        self.r.hset(keys.tenant(name), field, value)

    def drop_field(self, name: str, field: str) -> None:
        self.r.hdel(keys.tenant(name), field)

    def remove(self, name: str) -> None:
        """Drop a tenant's record (its keys' records stay, revoked by the caller first)."""
        pipe = self.r.pipeline()
        pipe.delete(keys.tenant(name))
        pipe.srem(keys.TENANTS, name)
        pipe.execute()

    def inflight_run_ids(self, name: str) -> list[str]:
        """The tenant's runs not finished yet (its in-flight set, kept by the run store)."""
        return sorted(i.decode() for i in self.r.smembers(keys.tenant_inflight(name)))

    def names(self) -> set[str]:
        """The tenants added with a record (not those that exist only by configuration)."""
        return {n.decode() for n in self.r.smembers(keys.TENANTS)}

    def registered_count(self) -> int:
        """Tenant records plus API keys ever issued (`reactq serve` warns when both are none)."""
        return int(self.r.scard(keys.TENANTS)) + int(self.r.scard(keys.API_KEYS))

    # --- API keys -----------------------------------------------------------------------------
    def add_key(self, tenant: str, key_id: str, sha256: str, created_at: float) -> None:
        pipe = self.r.pipeline()
        pipe.hset(keys.api_key(key_id), mapping={"tenant": tenant, "sha256": sha256, "created_at": str(created_at)})
        pipe.sadd(keys.tenant_keys(tenant), key_id)
        pipe.sadd(keys.API_KEYS, key_id)
        pipe.execute()

    def add_operator_key(self, key_id: str, sha256: str, created_at: float) -> None:
        """An operator key: no tenant; it signs in to the UI only (worker/api/ui/session.py)."""
        pipe = self.r.pipeline()
        pipe.hset(keys.api_key(key_id), mapping={"operator": "1", "sha256": sha256, "created_at": str(created_at)})
        pipe.sadd(keys.OPERATOR_KEYS, key_id)
        pipe.sadd(keys.API_KEYS, key_id)
        pipe.execute()

    def operator_key_ids(self) -> set[str]:
        return {i.decode() for i in self.r.smembers(keys.OPERATOR_KEYS)}

    def key_ids(self, tenant: str) -> set[str]:
        return {i.decode() for i in self.r.smembers(keys.tenant_keys(tenant))}

    def key(self, key_id: str) -> dict[str, str]:
        """An API key's record: tenant, sha256, created_at, revoked_at (empty: unknown)."""
        return text_fields(self.r.hgetall(keys.api_key(key_id)))

    def key_tenant(self, key_id: str) -> str | None:
        tenant = self.r.hget(keys.api_key(key_id), "tenant")
        return None if tenant is None else tenant.decode()

    def revoke_key(self, key_id: str, at: float) -> None:
        """Mark a key revoked at `at` (a key revoked before keeps its first time)."""
        self.r.hsetnx(keys.api_key(key_id), "revoked_at", str(at))
