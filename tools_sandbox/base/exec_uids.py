"""The host uid a tenant's code runs as in a Docker sandbox: one per tenant, from a reserved range.

Per-user kernel limits (inotify instances and watches, POSIX message-queue bytes, pipe buffers,
RLIMIT_NPROC) are counted per host uid across every container of the host. With one uid for every
sandbox, one tenant could exhaust them for all the others (and read how much others use). Each tenant
gets its own uid instead, derived from the tenant name (stable across workers and hosts, no state to
share): a hash into a range of 2**29 uids above every account and the usual container ranges. Two
tenants share a uid only on a hash collision (for 1,000 tenants a chance of about 1 in 1,000).
Executions of one tenant share its uid: they are the same principal. See docs/decisions/tool-isolation.md.
"""

from __future__ import annotations

import hashlib

EXEC_UID_BASE = 1 << 30
EXEC_UID_SPAN = 1 << 29


def exec_uid(tenant: str) -> int:
    """The uid `tenant`'s code runs as: in [EXEC_UID_BASE, EXEC_UID_BASE + EXEC_UID_SPAN)."""
    digest = hashlib.sha256(b"reactq-sandbox-uid\0" + tenant.encode("utf-8")).digest()
    return EXEC_UID_BASE + int.from_bytes(digest[:8], "big") % EXEC_UID_SPAN
