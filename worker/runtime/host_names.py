"""Which `Host` header names a listener answers to (REACTQ_API_ALLOWED_HOSTS; docs/decisions/exposure.md):
the API app (`worker.api.hosts.HostGuard`) and the API's own metrics listener check every request with it,
so a web page whose name was re-pointed at 127.0.0.1 (DNS rebinding) reaches neither."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

# a Host header: a name or IPv4 address, or a bracketed IPv6 address, then an optional port
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::[0-9]{1,5})?")


def host_name(header: str) -> str | None:
    """The host of a Host header without its port, lower case, a trailing dot dropped (None: malformed)."""
    match = _HOST.fullmatch(header.strip())
    return match.group(1).lower().rstrip(".") if match else None


def is_address(name: str) -> bool:
    """An IP address, not a name: no page can re-point it (its origin is that address already)."""
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


class AllowedHosts:
    """`names` as the setting has them: exact names (any port), `*.example.com` for every name under
    example.com, or `*` for every name (a proxy in front checks them). `addresses`: any IP address too
    (Prometheus and the kubelet reach a pod by its IP)."""

    def __init__(self, names: Iterable[str], *, addresses: bool = False) -> None:
        self.names = {n.strip().lower().rstrip(".") for n in names if n.strip()}
        self.any = "*" in self.names
        self.suffixes = tuple(n[1:] for n in self.names if n.startswith("*."))
        self.addresses = addresses

    def allows(self, header: str | None) -> bool:
        name = host_name(header) if header else None
        if name is None:
            return False
        return (self.any or name in self.names or name.endswith(self.suffixes)
                or (self.addresses and is_address(name)))
