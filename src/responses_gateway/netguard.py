"""Where hosted tools may connect: the one SSRF check (remote MCP servers, web pages fetched).

A URL a request supplies (``tools[i].server_url``, a page ``web_search`` opens) is a request to make
the gateway connect somewhere on the client's behalf. :class:`NetGuard` refuses it unless

- its scheme is ``http`` or ``https``;
- its host matches the operator's allow-list, when there is one (``--tool-allow-host``: exact names,
  or ``*.example.com`` for the subdomains of ``example.com``);
- every address the host resolves to is a public (global unicast) address: loopback, private,
  link-local, shared (CGNAT), multicast, reserved and unspecified addresses are refused, IPv4-mapped
  IPv6 addresses judged as the IPv4 address they carry, unless the address is in a network the
  operator allowed (``--tool-allow-network 127.0.0.1/32``).

The check runs twice: once before anything is sent (:meth:`NetGuard.check_url`, a plain 400), and
again at connect time for every connection (:class:`GuardedBackend`: the host is resolved, the
addresses checked, and the connection made to the checked address, so a name that resolves
differently the second time — DNS rebinding — is still refused). Redirects open new connections, so
they pass the same check. The name stays the TLS server name, so certificates are verified as usual.

Servers the operator names in the models file are trusted: they are reached without this check.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpcore2
import httpx2

__all__ = ["GuardedBackend", "NetGuard", "NetPolicy", "NetRefused", "guarded_client"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_RESOLVE_TIMEOUT = 10.0


class NetRefused(Exception):
    """A destination the policy does not allow (the message says why, without secrets)."""


@dataclass(frozen=True, slots=True)
class NetPolicy:
    """The operator's rules: hosts a request may name (empty: any public host) and the non-public
    networks it may still reach."""

    allow_hosts: tuple[str, ...] = ()
    allow_networks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for net in self.allow_networks:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(f"not a network (CIDR): {net!r}") from None
        for host in self.allow_hosts:
            bare = host[2:] if host.startswith("*.") else host
            if not bare or "/" in bare or (":" in bare.strip("[]") and not _is_ip(bare.strip("[]"))):
                raise ValueError(f"not a host name or pattern: {host!r}")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class NetGuard:
    """:class:`NetPolicy` applied: host names checked, addresses resolved and checked."""

    def __init__(self, policy: NetPolicy | None = None) -> None:
        self.policy = policy or NetPolicy()
        self._networks: tuple[Network, ...] = tuple(
            ipaddress.ip_network(n, strict=False) for n in self.policy.allow_networks
        )
        self._hosts = tuple(h.lower() for h in self.policy.allow_hosts)

    def check_host(self, host: str) -> None:
        """Refuse a host name the allow-list does not cover (no list: every name passes here)."""
        if not self._hosts:
            return
        name = host.lower().rstrip(".")
        for pattern in self._hosts:
            if pattern.startswith("*."):
                if name.endswith(pattern[1:]) and len(name) > len(pattern) - 1:
                    return
            elif name == pattern.strip("[]"):
                return
        raise NetRefused(f"the host {host!r} is not on this gateway's allow-list for tool connections")

    def allowed_address(self, address: Address) -> bool:
        if any(address in net for net in self._networks):
            return True
        mapped = getattr(address, "ipv4_mapped", None)
        if mapped is not None:
            return self.allowed_address(mapped)
        return address.is_global and not address.is_multicast and not address.is_reserved

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses of ``host``, every one of them allowed; NetRefused otherwise."""
        self.check_host(host)
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM), _RESOLVE_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            raise NetRefused(f"cannot resolve the host {host!r}") from exc
        addresses: list[str] = []
        for info in infos:
            text = str(info[4][0]).split("%", 1)[0]
            address = ipaddress.ip_address(text)
            if not self.allowed_address(address):
                raise NetRefused(
                    f"the host {host!r} resolves to a non-public address ({address}), which this gateway "
                    "does not connect to for tools (an operator may allow it with --tool-allow-network)"
                )
            if text not in addresses:
                addresses.append(text)
        if not addresses:
            raise NetRefused(f"cannot resolve the host {host!r}")
        return addresses

    async def check_url(self, url: str) -> None:
        """Refuse a URL the policy does not allow, before anything is sent to it."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise NetRefused("not a valid URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise NetRefused("the URL must be http:// or https:// with a host")
        await self.resolve(parts.hostname, port or (443 if parts.scheme == "https" else 80))


class GuardedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's network backend with the guard at connect time: the host resolved and checked, the
    connection made to a checked address (never resolved again by anyone else)."""

    def __init__(self, guard: NetGuard) -> None:
        self.guard = guard
        self.inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            addresses = await self.guard.resolve(host, port)
        except NetRefused as exc:
            raise httpcore2.ConnectError(str(exc)) from None
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self.inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("unix sockets are not allowed for tool connections")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class _GuardedTransport(httpx2.AsyncHTTPTransport):
    def __init__(self, guard: NetGuard) -> None:
        super().__init__(trust_env=False)
        # httpx2 builds its pool with the default backend; the guarded one replaces it (same TLS
        # context, so certificates are verified against the URL's host name as usual).
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False), network_backend=GuardedBackend(guard)
        )


def guarded_client(
    guard: NetGuard | None,
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
) -> httpx2.AsyncClient:
    """An httpx2 client whose every connection passes ``guard`` (None: a trusted destination, no
    check), without proxies from the environment."""
    kwargs: dict[str, Any] = {"timeout": timeout or httpx2.Timeout(30.0), "trust_env": False}
    if headers is not None:
        kwargs["headers"] = headers
    if auth is not None:
        kwargs["auth"] = auth
    if guard is not None:
        kwargs["transport"] = _GuardedTransport(guard)
    return httpx2.AsyncClient(**kwargs)
