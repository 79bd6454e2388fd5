"""Who the client is behind reverse proxies: the one address that the failure limits count,
``/metrics`` admits and the log lines name.

Without ``xheaders`` it is the socket's peer, and no header changes it. With ``xheaders``, a
peer outside ``proxy.trusted_networks`` (which the configuration then requires) is a client
that connected directly: it is the client, whatever headers it sent. Behind a peer inside
them, ``X-Forwarded-For`` is read from its right end, where each proxy appended the address it
was reached from: the address ``proxy.trusted_hops`` places before the peer, or, with no hops
given, the first address from the right that is not in those networks. Whatever a client put
at the left end itself is never taken. ``X-Real-IP`` (set by the nearest proxy alone) is taken
only where ``proxy.real_ip_header`` says so, and only from a peer inside the networks. An
address that is not an IP address stops the walk at the last trusted one.

``unix`` among the networks is the peer on ``server.unix_socket``: a proxy on the same host
that connects through a file only it may open. A loopback network (``127.0.0.1/32``) would be
every local process, which may connect from any loopback address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

from tornado.httputil import HTTPServerRequest

from tokensvc.config import UNIX_PEER

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip().split("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class ClientAddress:
    """The client's address of a request, as the ``xheaders`` and ``[proxy]`` settings say."""

    def __init__(self, enabled: bool, trusted_hops: int = 0, trusted_networks: Sequence[str] = (),
                 real_ip_header: bool = False) -> None:
        self.enabled, self.hops, self.real_ip = enabled, trusted_hops, real_ip_header
        self.unix = UNIX_PEER in trusted_networks
        self.networks: list[Network] = [ipaddress.ip_network(network, strict=False)
                                        for network in trusted_networks if network != UNIX_PEER]

    def __call__(self, request: HTTPServerRequest) -> str:
        peer = request.remote_ip or ""  # Tornado's "0.0.0.0" for a unix socket's peer
        if not self.enabled:
            return peer
        if not (self._in_networks(peer) or (self.unix and _on_unix_socket(request))):
            return peer  # a client reached the service directly: its headers say nothing
        if self.real_ip:
            real = _ip(request.headers.get("X-Real-IP", ""))
            return str(real) if real is not None else peer
        forwarded = [entry for value in request.headers.get_list("X-Forwarded-For") for entry in value.split(",")]
        chain = [*forwarded, peer]
        client = peer
        for distance, entry in enumerate(reversed(chain)):
            address = _ip(entry)
            if address is None:
                return client  # a malformed entry: nothing to its left can be trusted
            client = str(address)
            if not self._trusted(client, distance):
                return client
        return client

    def _trusted(self, address: str, distance: int) -> bool:
        """Whether ``address``, ``distance`` hops from the service, is one of its proxies (the
        peer, at distance 0, always is here: it was checked first)."""
        if self.hops:
            return distance < self.hops
        return distance == 0 or self._in_networks(address)

    def _in_networks(self, address: str) -> bool:
        # (A unix socket's peer, 0.0.0.0 here, is in no network: "unix" is not one.)
        ip = _ip(address)
        return ip is not None and any(ip in network for network in self.networks)


def _on_unix_socket(request: HTTPServerRequest) -> bool:
    """Whether the request came through a unix socket (``server.unix_socket``)."""
    context = getattr(request.connection, "context", None)
    return getattr(context, "address_family", None) == socket.AF_UNIX
