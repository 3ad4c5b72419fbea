"""netguard: the one SSRF check hosted tools use (addresses, the host allow-list, connect time)."""

from __future__ import annotations

import asyncio
import ipaddress

import httpcore2
import pytest

from responses_gateway.netguard import GuardedBackend, NetGuard, NetPolicy, NetRefused


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "::1",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not NetGuard().allowed_address(ipaddress.ip_address(address))


def test_public_addresses_and_allowed_networks() -> None:
    guard = NetGuard(NetPolicy(allow_networks=("127.0.0.1/32", "10.0.0.0/8")))
    assert NetGuard().allowed_address(ipaddress.ip_address("93.184.216.34"))
    assert NetGuard().allowed_address(ipaddress.ip_address("2606:4700::1111"))
    assert guard.allowed_address(ipaddress.ip_address("127.0.0.1"))
    assert guard.allowed_address(ipaddress.ip_address("10.9.9.9"))
    assert guard.allowed_address(ipaddress.ip_address("::ffff:10.9.9.9"))
    assert not guard.allowed_address(ipaddress.ip_address("127.0.0.2"))
    with pytest.raises(ValueError, match="not a network"):
        NetPolicy(allow_networks=("nonsense",))


def test_the_host_allow_list() -> None:
    guard = NetGuard(NetPolicy(allow_hosts=("mcp.example.com", "*.tools.example.org")))
    guard.check_host("mcp.example.com")
    guard.check_host("MCP.Example.com.")
    guard.check_host("a.tools.example.org")
    for host in ("example.com", "tools.example.org", "evil-tools.example.org", "mcp.example.com.evil"):
        with pytest.raises(NetRefused, match="allow-list"):
            guard.check_host(host)


def test_urls_are_checked_before_anything_is_sent() -> None:
    guard = NetGuard()
    for url, why in [
        ("http://127.0.0.1:1/", "non-public"),
        ("http://localhost/", "non-public"),
        ("ftp://example.com/", "http:// or https://"),
        ("http:///nohost", "http:// or https://"),
        ("http://[::1", "not a valid URL"),
    ]:
        with pytest.raises(NetRefused, match=why):
            asyncio.run(guard.check_url(url))


def test_connect_time_check() -> None:
    """A connection is refused at connect time whatever was checked before (DNS rebinding): the
    backend resolves and checks again, and connects only to the address it checked."""
    refused = GuardedBackend(NetGuard())
    with pytest.raises(httpcore2.ConnectError, match="non-public"):
        asyncio.run(refused.connect_tcp("localhost", 80, timeout=2))
    with pytest.raises(httpcore2.ConnectError, match="unix sockets"):
        asyncio.run(refused.connect_unix_socket("/tmp/x.sock"))


def test_dns_rebinding_is_refused_at_connect_time() -> None:
    """A name that resolves to a public address when checked and to loopback when connected to."""
    import socket

    import httpx2

    from responses_gateway.netguard import guarded_client

    async def main() -> None:
        loop = asyncio.get_running_loop()
        answers = iter(["93.184.216.34", "127.0.0.1"])

        async def rebinding(host: str, port: int, **_: object) -> list[tuple[object, ...]]:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

        loop.getaddrinfo = rebinding  # type: ignore[method-assign]
        guard = NetGuard()
        await guard.check_url("http://rebind.example/")  # public when checked
        async with guarded_client(guard) as http:
            with pytest.raises(httpx2.ConnectError, match=r"non-public address \(127\.0\.0\.1\)"):
                await http.get("http://rebind.example/")

    asyncio.run(main())
