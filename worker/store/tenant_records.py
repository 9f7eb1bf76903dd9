"""Tenant records and API key records (worker/tenancy/tenants.py decides what goes in them: plans,
overrides, key format and hashing). Values cross as plain strings: the store knows no plan or policy."""

from __future__ import annotations

import redis

from . import keys
from .connection import text_fields


class TenantStore:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    # --- tenants (by id; the name -> id index is keys.TENANT_IDS) ----------------------------------
    def add(self, tenant_id: str, name: str, plan: str, created_at: float) -> bool:
        """Record a new tenant `name` with id `tenant_id`; False (nothing written) if the name is taken: by
        a tenant of the index, or by one recorded before ids existed (its id is its name)."""
        if self.r.exists(keys.tenant(name)) and not self.r.hexists(keys.TENANT_IDS, name):
            return False
        if not self.r.hsetnx(keys.TENANT_IDS, name, tenant_id):
            return False
        pipe = self.r.pipeline()
        pipe.hset(keys.tenant(tenant_id), mapping={"name": name, "plan": plan, "created_at": str(created_at)})
        pipe.sadd(keys.TENANTS, tenant_id)
        pipe.execute()
        return True

    def id_of(self, name: str) -> str | None:
        """The id of the tenant named `name` now: the index's, else (recorded before ids) the name itself
        when it has a record; None when neither."""
        found = self.r.hget(keys.TENANT_IDS, name)
        if found is not None:
            return found.decode()
        return name if self.r.exists(keys.tenant(name)) else None

    def exists(self, tenant_id: str) -> bool:
        return bool(self.r.exists(keys.tenant(tenant_id)))

    def record(self, tenant_id: str) -> dict[str, str]:
        """A tenant's record: name, plan, created_at, budget overrides (empty: no record)."""
        return text_fields(self.r.hgetall(keys.tenant(tenant_id)))

    def set_field(self, tenant_id: str, field: str, value: str) -> None:
        self.r.hset(keys.tenant(tenant_id), field, value)

    def drop_field(self, tenant_id: str, field: str) -> None:
        self.r.hdel(keys.tenant(tenant_id), field)

    def remove(self, tenant_id: str, keep_webhook: bool = False) -> None:
        """Drop a tenant's record, its name's entry (if still this id's) and, unless `keep_webhook`, its
        webhook URL and secret (its keys' records stay, revoked by the caller first)."""
        raw = self.r.hget(keys.tenant(tenant_id), "name")
        name = raw.decode() if raw is not None else tenant_id  # recorded before ids: its name is its id
        pipe = self.r.pipeline()
        pipe.delete(keys.tenant(tenant_id), *([] if keep_webhook else [keys.tenant_webhook(tenant_id)]))
        pipe.srem(keys.TENANTS, tenant_id)
        pipe.execute()
        if self.r.hget(keys.TENANT_IDS, name) == tenant_id.encode():
            self.r.hdel(keys.TENANT_IDS, name)

    def inflight_run_ids(self, tenant_id: str) -> list[str]:
        """The tenant's runs not finished yet (its in-flight set, kept by the run store)."""
        return sorted(i.decode() for i in self.r.smembers(keys.tenant_inflight(tenant_id)))

    def ids(self) -> set[str]:
        """The ids of the tenants added with a record (not those that exist only by configuration)."""
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
