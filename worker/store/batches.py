"""A batch's Redis state: its record (owner, size, usage, finished runs by status), its run ids in
submission and in finishing order, the client-id index of a `reactq batch` file, and the view its
webhook and `GET /v1/batches/{id}` show."""

from __future__ import annotations

import time
from collections.abc import Iterator

import redis

from . import keys


def batch_keys(batch_id: str) -> tuple[str, ...]:
    """Every key of a batch (its runs' keys are theirs)."""
    return (keys.batch(batch_id), keys.batch_runs(batch_id), keys.batch_done(batch_id), keys.batch_ids(batch_id),
            keys.batch_webhook_sent(batch_id))


class BatchStore:
    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self.r = client
        self.ttl = ttl_s  # a batch outlives its runs, moving or finished

    def create(self, batch_id: str, meta: dict[str, str]) -> None:
        """`meta` names the batch's `tenant` (its owner) and its `size`."""
        pipe = self.r.pipeline(transaction=False)
        now = time.time()
        fields = {"created_at": str(now), keys.BATCH_COUNTS_STATUSES: "1", **meta}
        pipe.hset(keys.batch(batch_id), mapping=fields)
        pipe.expire(keys.batch(batch_id), self.ttl)
        if "tenant" in meta:
            self._index(pipe, batch_id, meta["tenant"], now)
        pipe.execute()

    def _index(self, pipe: redis.client.Pipeline, batch_id: str, tenant: str, at: float) -> None:
        """List the batch in its tenant's index and the operator's (the UI's batches page), trimmed to the
        batches' TTL."""
        for index in (keys.tenant_batches(tenant), keys.BATCHES):
            pipe.zadd(index, {batch_id: at}, nx=True)
            pipe.zremrangebyscore(index, "-inf", at - self.ttl)
            pipe.expire(index, self.ttl)

    def recent(self, tenant: str | None, limit: int, before: float | None = None) -> list[tuple[str, float]]:
        """Up to `limit` batch ids with their creation times, newest first, older than `before`: the
        tenant's, or (None) every tenant's. Batches made before these indexes existed are not listed."""
        index = keys.BATCHES if tenant is None else keys.tenant_batches(tenant)
        found = self.r.zrevrangebyscore(index, f"({before}" if before else "+inf", "-inf", start=0, num=limit,
                                        withscores=True)
        return [(m.decode(), float(score)) for m, score in found]

    def forget(self, tenant: str | None, batch_ids: list[str]) -> None:
        """Drop expired batches from the indexes (met while listing)."""
        if batch_ids:
            pipe = self.r.pipeline(transaction=False)
            for index in (keys.BATCHES, *([keys.tenant_batches(tenant)] if tenant else [])):
                pipe.zrem(index, *batch_ids)
            pipe.execute()

    def drop_record(self, batch_id: str) -> None:
        """Forget a batch whose submission failed before any run of it was written (its record and its
        places in the indexes: a refused request leaves nothing)."""
        tenant = self.r.hget(keys.batch(batch_id), "tenant")
        pipe = self.r.pipeline(transaction=False)
        pipe.delete(keys.batch(batch_id))
        for index in (keys.BATCHES, *([keys.tenant_batches(tenant.decode())] if tenant else [])):
            pipe.zrem(index, batch_id)
        pipe.execute()

    def iter_run_ids(self, batch_id: str, chunk: int = 500) -> Iterator[list[str]]:
        """The batch's run ids, `chunk` at a time (memory flat in the batch's size)."""
        start = 0
        while ids := self.r.lrange(keys.batch_runs(batch_id), start, start + chunk - 1):
            yield [i.decode() for i in ids]
            start += len(ids)

    def finished_range(self, batch_id: str, start: int, count: int) -> list[str]:
        """Up to `count` ids of the batch's finished runs, from position `start` in finishing order."""
        return [i.decode() for i in self.r.lrange(keys.batch_done(batch_id), start, start + count - 1)]

    def finished_since(self, batch_id: str, start: int) -> list[str]:
        return [i.decode() for i in self.r.lrange(keys.batch_done(batch_id), start, -1)]

    def size(self, batch_id: str) -> int:
        return int(self.r.llen(keys.batch_runs(batch_id)))

    def finished_count(self, batch_id: str) -> int:
        return int(self.r.llen(keys.batch_done(batch_id)))

    def progress(self, batch_id: str) -> tuple[int, int]:
        """(finished runs, runs) of a batch, in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        pipe.llen(keys.batch_done(batch_id))
        pipe.llen(keys.batch_runs(batch_id))
        finished, size = pipe.execute()
        return int(finished), int(size)

    def for_file(self, digest: str) -> str | None:
        """The batch last submitted for one output file (a re-run adopts its runs), if any."""
        previous = self.r.get(keys.batch_file(digest))
        return previous.decode() if previous else None

    def set_for_file(self, digest: str, batch_id: str) -> None:
        self.r.set(keys.batch_file(digest), batch_id, ex=self.ttl)

    def run_ids_of(self, batch_id: str, client_ids: list[str]) -> list[str]:
        """The run ids of these lines of a batch ("" for a line it does not have)."""
        if not client_ids:
            return []
        return [v.decode() if v else "" for v in self.r.hmget(keys.batch_ids(batch_id), client_ids)]

    def claim_owner(self, batch_id: str, tenant: str) -> None:
        """The batch's tenant: the one its runs name (a batch is one tenant's, as its API is; the batch
        service refuses runs of another)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hsetnx(keys.batch(batch_id), "tenant", tenant)
        self._index(pipe, batch_id, tenant, time.time())
        pipe.execute()

    def mark_written(self, batch_id: str, count: int) -> None:
        """`reactq batch` has written the results of the first `count` runs of the finished list."""
        self.r.hset(keys.batch(batch_id), "written", str(count))

    def mark_complete(self, batch_id: str) -> None:
        """`reactq batch` has written every run's result (a rerun for the same file adopts none)."""
        self.r.hset(keys.batch(batch_id), "complete", "1")

    def written_ids(self, batch_id: str, chunk: int = 1000) -> Iterator[str]:
        """The runs whose results `reactq batch` wrote (per `mark_written`), `chunk` ids a round trip."""
        written = int(self.r.hget(keys.batch(batch_id), "written") or 0)
        for start in range(0, written, chunk):
            yield from self.finished_range(batch_id, start, min(chunk, written - start))

    def mark_submitted(self, batch_id: str, size: int) -> None:
        """Every run of the batch has been submitted: its size is known."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(keys.batch(batch_id), "size", str(size))
        pipe.hdel(keys.batch(batch_id), "submitting")
        pipe.execute()

    def info_unless_claimed(self, batch_id: str) -> dict[str, str] | None:
        """The batch's record (`info`), or None if its webhook is claimed already: in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(keys.batch(batch_id))
        pipe.exists(keys.batch_webhook_sent(batch_id))
        raw, claimed = pipe.execute()
        return None if claimed else {k.decode(): v.decode() for k, v in raw.items()}

    def claim_webhook(self, batch_id: str, ttl_s: int) -> bool:
        """True for the first caller only: the one that sends the batch's webhook."""
        return bool(self.r.set(keys.batch_webhook_sent(batch_id), "1", nx=True, ex=ttl_s))

    def record_ids(self, batch_id: str, mapping: dict[str, str]) -> None:
        """client id -> run id of runs just submitted in a batch."""
        if mapping:
            pipe = self.r.pipeline(transaction=False)
            pipe.hset(keys.batch_ids(batch_id), mapping=mapping)
            pipe.expire(keys.batch_ids(batch_id), self.ttl)
            pipe.execute()

    def run_ids_page(self, batch_id: str, offset: int, limit: int) -> list[str]:
        return [i.decode() for i in self.r.lrange(keys.batch_runs(batch_id), offset, offset + limit - 1)]

    def info(self, batch_id: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.r.hgetall(keys.batch(batch_id)).items()}

    def delete(self, batch_id: str) -> None:
        owner = self.r.hget(keys.batch(batch_id), "tenant")
        self.r.delete(*batch_keys(batch_id))
        self.forget(owner.decode() if owner else None, [batch_id])
