"""What is stored under a tenant's id (keys.tenant(id) + ':*', its tool cache, its webhook deliveries), for
`reactq tenant remove`: kept until retention (`expire_all`) or removed now (`delete_all`, --purge). Its
runs and batches are removed through service/retention.py, which knows every key of a run."""

from __future__ import annotations

from collections.abc import Iterator

import redis

from . import keys

CHUNK = 500


class TenantData:
    def __init__(self, client: redis.Redis, scan_count: int = 1000) -> None:
        self.r = client
        self.scan_count = scan_count

    def _keys(self, tenant_id: str) -> Iterator[bytes]:
        for pattern in (f"{keys.tenant(tenant_id)}:*", f"{keys.PREFIX}:cache:{tenant_id}:*"):
            yield from self.r.scan_iter(match=pattern, count=self.scan_count)

    def run_ids(self, tenant_id: str) -> list[str]:
        return [m.decode() for m in self.r.zrange(keys.tenant_runs(tenant_id), 0, -1)]

    def batch_ids(self, tenant_id: str) -> list[str]:
        return [m.decode() for m in self.r.zrange(keys.tenant_batches(tenant_id), 0, -1)]

    def expire_all(self, tenant_id: str, ttl_s: int) -> int:
        """Give every key of the tenant without a TTL this one (those with one keep theirs); returns how
        many got it."""
        given = 0
        for key in self._keys(tenant_id):
            if self.r.ttl(key) == -1:
                given += int(bool(self.r.expire(key, ttl_s)))
        return given

    def delete_all(self, tenant_id: str) -> int:
        """Every key of the tenant and its webhook delivery records, now; returns how many went."""
        deliveries = [keys.webhook_delivery(i.decode())
                      for i in self.r.zrange(keys.tenant_deliveries(tenant_id), 0, -1)]
        doomed = [*deliveries, *(k.decode() for k in self._keys(tenant_id))]
        removed = 0
        for i in range(0, len(doomed), CHUNK):
            removed += int(self.r.delete(*doomed[i:i + CHUNK]))
        return removed
