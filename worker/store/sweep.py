"""Finding and removing stored runs and batches by scanning the keyspace (`reactq purge`, deletes):
the run ids and batch ids that exist, and every key of a set of runs."""

from __future__ import annotations

import re
from collections.abc import Iterator

import redis

from . import keys

# an id, or (on a Redis Cluster) an id whose first characters are a hash tag: {abc}def... (keys.run_tag)
_RUN_RECORD = re.compile(rf"^{keys.PREFIX}:run:{{?([^:{{}}]+)}}?([^:{{}}]*)$")
_RUN_ANY = re.compile(rf"^{keys.PREFIX}:run:{{?([^:{{}}]+)}}?([^:{{}}]*)(?::.*)?$")
_BATCH_RECORD = re.compile(rf"^{keys.PREFIX}:batch:{{?([^:{{}}]+)}}?$")
CHUNK = 500


class Sweep:
    def __init__(self, client: redis.Redis, scan_count: int = 1000) -> None:
        self.r = client
        self.scan_count = scan_count

    def run_ids(self) -> Iterator[str]:
        """Every run with a record (SCAN: each id about once; one a SCAN repeats is harmless)."""
        for key in self.r.scan_iter(match=f"{keys.PREFIX}:run:*", count=self.scan_count):
            if (m := _RUN_RECORD.match(key.decode())) is not None:
                yield m[1] + m[2]

    def batch_ids(self) -> Iterator[str]:
        for key in self.r.scan_iter(match=f"{keys.PREFIX}:batch:*", count=self.scan_count):
            if (m := _BATCH_RECORD.match(key.decode())) is not None:
                yield m[1]

    def delete_runs(self, run_ids: set[str]) -> int:
        """Every key of these runs, found by one more SCAN, and their entries in the active set; returns
        how many keys went."""
        removed = 0
        doomed: list[bytes] = []
        for key in self.r.scan_iter(match=f"{keys.PREFIX}:run:*", count=self.scan_count):
            if (m := _RUN_ANY.match(key.decode())) is not None and m[1] + m[2] in run_ids:
                doomed.append(key)
                if len(doomed) >= CHUNK:
                    removed += int(self.r.delete(*doomed))
                    doomed.clear()
        if doomed:
            removed += int(self.r.delete(*doomed))
        for active, ids in keys.by_active_set(sorted(run_ids)).items():
            for i in range(0, len(ids), CHUNK):
                self.r.zrem(active, *ids[i:i + CHUNK])
        return removed

    def delete_keys(self, run_id: str, names: list[str]) -> None:
        """These keys of one run, and its entry in the active set, in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        pipe.delete(*names)
        pipe.zrem(keys.active_runs(run_id), run_id)
        pipe.execute()
