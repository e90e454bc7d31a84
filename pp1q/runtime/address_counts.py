"""Open connections counted by client, against a bound in all and one per client: the
bookkeeping both HTTP servers share (the verifier's API, pp1q.verifier.http_gate, and
/metrics, pp1q.runtime.metrics_http). Sans-IO: no sockets, no locks (a threaded caller
holds its own)."""

from __future__ import annotations

import ipaddress


def client_address(peername: object) -> str:
    """The client a connection counts against: its IPv4 address, or its IPv6 /64 (one
    IPv6 client holds a whole /64, one address per connection if it likes); a peer name
    that is not an IP address counts as itself."""
    host = peername[0] if isinstance(peername, tuple) and peername else peername
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])  # no zone index
    except ValueError:
        return str(host)
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if ip.version == 6:
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class AddressCounts:
    """At most ``max_open`` connections, ``max_per_address`` of them (0: any number) for
    one client address; ``admit`` takes a place or says which bound is full."""

    def __init__(self, max_open: int, max_per_address: int) -> None:
        self.max_open = max_open
        self.max_per_address = max_per_address
        self.open = 0
        self.by_address: dict[str, int] = {}  # only addresses with a connection open

    def admit(self, address: str) -> str | None:
        """Take a place for ``address``: None, or the bound that is full ("open" or
        "address")."""
        if self.open >= self.max_open:
            return "open"
        held = self.by_address.get(address, 0)
        if self.max_per_address and held >= self.max_per_address:
            return "address"
        self.open += 1
        self.by_address[address] = held + 1
        return None

    def release(self, address: str) -> None:
        self.open -= 1
        left = self.by_address[address] - 1
        if left:
            self.by_address[address] = left
        else:
            del self.by_address[address]  # the table holds open addresses only: bounded
