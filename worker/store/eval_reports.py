"""Stored evaluation reports: the HTML `reactq eval --report` writes, kept in Redis per tenant so that the
UI (served by API processes on other machines) lists and opens them.

Each report is one hash (name, when, a small summary as JSON, the HTML zlib-compressed: a report's
repeated markup shrinks ~10x) with the run retention as its TTL, and each tenant has an index of its
reports, newest first, holding at most `kept` of them. A report larger than `max_bytes` is refused
(`ReportTooLarge`): the file on disk is the copy that always exists."""

from __future__ import annotations

import json
import re
import time
import zlib
from dataclasses import dataclass
from typing import Any

import redis

from ..errors import ReportTooLarge
from . import keys

__all__ = ["EvalReports", "ReportTooLarge", "StoredReport", "REPORT_ID"]

REPORT_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class StoredReport:
    id: str
    name: str
    created_at: float
    summary: dict[str, Any]
    html: str | None = None  # only from `get`


class EvalReports:
    def __init__(self, client: redis.Redis, keep_s: int, max_bytes: int, kept: int) -> None:
        self.r = client
        self.keep_s = keep_s
        self.max_bytes = max_bytes
        self.kept = kept

    def save(self, tenant: str, report_id: str, name: str, html: str, summary: dict[str, Any]) -> None:
        data = html.encode()
        if len(data) > self.max_bytes:
            raise ReportTooLarge(f"the report is {len(data)} bytes, more than REACTQ_EVAL_REPORT_MAX_BYTES "
                                 f"({self.max_bytes}) allows")
        if not REPORT_ID.fullmatch(report_id):
            raise ValueError(f"malformed report id {report_id!r}")
        now = time.time()
        index = keys.tenant_eval_reports(tenant)
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(keys.eval_report(tenant, report_id), mapping={
            "name": name, "created_at": repr(now), "summary": json.dumps(summary), "html": zlib.compress(data, 6)})
        pipe.expire(keys.eval_report(tenant, report_id), self.keep_s)
        pipe.zadd(index, {report_id: now})
        pipe.zremrangebyscore(index, "-inf", now - self.keep_s)
        pipe.expire(index, self.keep_s)
        pipe.execute()
        surplus = [i.decode() for i in self.r.zrange(index, 0, -self.kept - 1)]
        if surplus:  # the oldest beyond `kept`
            pipe = self.r.pipeline(transaction=True)
            pipe.delete(*(keys.eval_report(tenant, i) for i in surplus))
            pipe.zrem(index, *surplus)
            pipe.execute()

    def list(self, tenant: str, limit: int = 100) -> list[StoredReport]:
        """The tenant's reports, newest first (without their HTML)."""
        index = keys.tenant_eval_reports(tenant)
        ids = [i.decode() for i in self.r.zrevrange(index, 0, limit - 1)]
        pipe = self.r.pipeline(transaction=False)
        for report_id in ids:
            pipe.hmget(keys.eval_report(tenant, report_id), ["name", "created_at", "summary"])
        found, gone = [], []
        for report_id, (name, created, summary) in zip(ids, pipe.execute() if ids else [], strict=True):
            if name is None:
                gone.append(report_id)
                continue
            found.append(StoredReport(report_id, name.decode(), float(created), json.loads(summary)))
        if gone:  # expired: drop from the index as they are met
            self.r.zrem(index, *gone)
        return found

    def get(self, tenant: str, report_id: str) -> StoredReport | None:
        """One of the tenant's reports with its HTML, or None (unknown, expired, another tenant's)."""
        if not REPORT_ID.fullmatch(report_id):
            return None
        raw = self.r.hgetall(keys.eval_report(tenant, report_id))
        if not raw:
            return None
        return StoredReport(report_id, raw[b"name"].decode(), float(raw[b"created_at"]),
                            json.loads(raw[b"summary"]), zlib.decompress(raw[b"html"]).decode())


def from_settings(client: redis.Redis, settings: Any) -> EvalReports:
    """The store as the settings size it (`retention_s`, `eval_report_max_bytes`, `eval_reports_kept`)."""
    return EvalReports(client, settings.retention_s, settings.eval_report_max_bytes, settings.eval_reports_kept)
