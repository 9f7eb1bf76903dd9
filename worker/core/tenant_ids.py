"""A tenant's id and its name (pure). Data is stored under the id, which is never reused; the name is what
the operator types and may be given to a new tenant once the old one is removed
(docs/decisions/tenants-and-keys.md).

A tenant made by `reactq tenant add` since ids exist has the id `<name>.<random suffix>`; a tenant that
existed before (and one of REACTQ_TENANTS) has its name as its id, so data stored under names stays its
own without a migration. Names have no '.', so the two kinds never collide."""

from __future__ import annotations

import re

SEPARATOR = "."
TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
TENANT_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}(?:\.[a-z0-9]{16})?")


def tenant_name(tenant_id: str) -> str:
    """The name a tenant had when `tenant_id` was made (its name for good: a tenant is never renamed)."""
    return tenant_id.partition(SEPARATOR)[0]
