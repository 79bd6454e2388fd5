"""Behind reverse proxies: the client's address is read from X-Forwarded-For back past the
trusted proxies only, never from what a client wrote itself, and only behind a peer in
proxy.trusted_networks (a client connecting directly is taken at its word for nothing);
X-Real-IP only where configured. The failure limits, /metrics and the log lines all use that
one address."""

from __future__ import annotations

import http.client
import logging
import socket

import pytest
from helpers import Browser, json_of, make_config
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from tokensvc.handlers.edge.proxies import ClientAddress


def request(peer: str, **headers: str | list[str]) -> HTTPServerRequest:
    sent = HTTPHeaders({"Host": "tokensvc.example"})
    for name, values in headers.items():
        for value in [values] if isinstance(values, str) else values:
            sent.add(name.replace("_", "-"), value)
    made = HTTPServerRequest(start_line=RequestStartLine("GET", "/", "HTTP/1.1"), headers=sent)
    made.remote_ip = peer
    return made


def test_without_xheaders_no_header_counts():
    address = ClientAddress(False)
    assert address(request("203.0.113.9", X_Forwarded_For="10.1.2.3", X_Real_IP="10.1.2.3")) == "203.0.113.9"


def test_trusted_hops_count_back_from_the_right():
    one = ClientAddress(True, trusted_hops=1, trusted_networks=["127.0.0.1/32"])
    # nginx appended the address it was reached from; the client wrote the rest.
    assert one(request("127.0.0.1", X_Forwarded_For="6.6.6.6, 10.9.9.9, 198.51.100.7")) == "198.51.100.7"
    assert one(request("127.0.0.1", X_Forwarded_For=["6.6.6.6", "198.51.100.7"])) == "198.51.100.7"
    assert one(request("127.0.0.1", X_Real_IP="10.1.2.3")) == "127.0.0.1"  # X-Real-IP not configured
    # A cloud load balancer (anywhere), then an ingress in the pod network.
    two = ClientAddress(True, trusted_hops=2, trusted_networks=["10.0.0.0/8"])
    assert two(request("10.0.0.5", X_Forwarded_For="6.6.6.6, 198.51.100.7, 34.1.2.3")) == "198.51.100.7"


def test_a_client_that_connects_directly_is_taken_at_its_word_for_nothing():
    """trusted_hops only counts behind a peer in trusted_networks: a client that reaches the
    service itself and writes X-Forwarded-For (or X-Real-IP) is its own address."""
    for address in (ClientAddress(True, trusted_hops=1),  # no proxy named: none is believed
                    ClientAddress(True, trusted_hops=1, trusted_networks=["10.0.0.0/8"]),
                    ClientAddress(True, trusted_hops=2, trusted_networks=["10.0.0.0/8"], real_ip_header=True),
                    ClientAddress(True, trusted_networks=["10.0.0.0/8"])):
        assert address(request("203.0.113.9", X_Forwarded_For="10.1.1.1, 10.2.2.2",
                               X_Real_IP="10.3.3.3")) == "203.0.113.9"


def test_xheaders_need_the_proxies_networks():
    from tokensvc.config import ConfigError

    with pytest.raises(ConfigError, match=r"^proxy.trusted_networks: required with xheaders"):
        make_config(xheaders=True, proxy={"trusted_hops": 1})
    assert make_config(xheaders=True, proxy={"trusted_networks": ["10.0.0.0/8"]}).proxy.trusted_hops == 0


def test_trusted_networks_are_skipped_from_the_right():
    address = ClientAddress(True, trusted_networks=["10.0.0.0/8", "127.0.0.0/8"])
    assert address(request("10.0.0.5", X_Forwarded_For="6.6.6.6, 198.51.100.7, 10.3.3.3")) == "198.51.100.7"
    assert address(request("203.0.113.9", X_Forwarded_For="10.1.1.1")) == "203.0.113.9"  # not from a proxy
    assert address(request("10.0.0.5", X_Forwarded_For="6.6.6.6, junk, 10.2.2.2")) == "10.2.2.2"  # stops there


def test_x_real_ip_only_where_configured_and_from_a_trusted_peer():
    address = ClientAddress(True, trusted_networks=["127.0.0.0/8"], real_ip_header=True)
    assert address(request("127.0.0.1", X_Real_IP="198.51.100.7", X_Forwarded_For="6.6.6.6")) == "198.51.100.7"
    assert address(request("203.0.113.9", X_Real_IP="198.51.100.7")) == "203.0.113.9"
    assert address(request("127.0.0.1", X_Real_IP="not-an-ip")) == "127.0.0.1"


LIMITS = {"failed_logins_per_username": 3, "failed_logins_per_address": 5}
BEHIND_NGINX = make_config(xheaders=True, proxy={"trusted_hops": 1, "trusted_networks": ["127.0.0.1/32"]},
                           metrics={"allow": ["10.0.0.0/8"]}, limits=LIMITS)
# The proxies are elsewhere: this test's client (127.0.0.1) connects directly.
PROXIES_ELSEWHERE = make_config(xheaders=True, proxy={"trusted_hops": 1, "trusted_networks": ["192.0.2.0/24"]},
                                metrics={"allow": ["10.0.0.0/8"]}, limits=LIMITS)


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("config", [BEHIND_NGINX, PROXIES_ELSEWHERE], ids=["behind-nginx", "direct"])
async def test_rotating_spoofed_headers_get_no_more_guesses(http_client, base_url, config):
    """60 wrong passwords, each with a new X-Real-IP and a new address of the client's own at
    the left of X-Forwarded-For: the proxy's entry stays the same, and so does the limit."""
    browser = Browser(http_client, base_url)
    xsrf = await browser.xsrf()
    codes = []
    for n in range(60):
        response = await browser.fetch("/login", "POST", {"username": "alice", "password": "wrong-password",
                                                          "_xsrf": xsrf},
                                       headers={"X-Real-IP": f"10.7.{n}.1",
                                                "X-Forwarded-For": f"10.8.{n}.1, 198.51.100.7"})
        codes.append(response.code)
    assert codes.count(401) == 3 and codes.count(429) == 57


@pytest.mark.gen_test
@pytest.mark.parametrize("config", [BEHIND_NGINX])
async def test_metrics_admit_the_address_the_proxy_saw(http_client, base_url, config, caplog):
    async def scrape(**headers):
        return await http_client.fetch(base_url + "/metrics", headers=headers, raise_error=False)

    assert (await scrape()).code == 404  # 127.0.0.1, the proxy itself, is not in 10.0.0.0/8
    assert (await scrape(**{"X-Real-IP": "10.1.2.3"})).code == 404
    assert (await scrape(**{"X-Forwarded-For": "10.1.2.3, 203.0.113.5"})).code == 404
    with caplog.at_level(logging.INFO, logger="tokensvc.access"):
        admitted = await scrape(**{"X-Forwarded-For": "203.0.113.5, 10.1.2.3"})
    assert admitted.code == 200
    assert any(record.getMessage().startswith("10.1.2.3 200 GET /metrics") for record in caplog.records)


@pytest.mark.gen_test
async def test_without_xheaders_a_header_changes_nothing(http_client, base_url, caplog):
    with caplog.at_level(logging.INFO, logger="tokensvc.access"):
        response = await http_client.fetch(base_url + "/healthz", headers={"X-Forwarded-For": "10.1.2.3",
                                                                           "X-Real-IP": "10.1.2.3"})
    assert json_of(response)["status"] == "ok"
    assert any(record.getMessage().startswith("127.0.0.1 200 GET /healthz") for record in caplog.records)


@pytest.mark.gen_test
@pytest.mark.parametrize("config", [PROXIES_ELSEWHERE])
async def test_a_client_connecting_directly_opens_no_metrics_with_a_header(http_client, base_url, config):
    for headers in ({"X-Forwarded-For": "10.1.2.3"}, {"X-Forwarded-For": "203.0.113.5, 10.1.2.3"},
                    {"X-Real-IP": "10.1.2.3"}):
        assert (await http_client.fetch(base_url + "/metrics", headers=headers, raise_error=False)).code == 404


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("config", [BEHIND_NGINX])
async def test_the_addresses_of_one_ipv6_network_are_one_address_to_the_limits(http_client, base_url, config):
    """A host holds a whole IPv6 /64 and may pick any address of it: 30 wrong passwords, each
    from a new address of 2001:db8:1:2::/64 (as the proxy saw them), for a new username each
    time, get the address's limit's worth of answers; another /64 is another address."""
    browser = Browser(http_client, base_url)
    xsrf = await browser.xsrf()

    async def guess(n: int, address: str) -> int:
        response = await browser.fetch("/login", "POST", {"username": f"user{n}", "password": "wrong-password",
                                                          "_xsrf": xsrf},
                                       headers={"X-Forwarded-For": address})
        return response.code

    codes = [await guess(n, f"2001:db8:1:2:{n:x}::{n + 1:x}") for n in range(30)]
    assert codes.count(401) == 5 and codes.count(429) == 25  # failed_logins_per_address
    assert await guess(99, "2001:db8:1:3::1") == 401


def test_the_limits_key_an_ipv6_address_by_its_network():
    from tokensvc.config import LimitSettings
    from tokensvc.ratelimit import FailureLimits

    limits = FailureLimits(LimitSettings())
    assert limits.address_key("2001:db8:1:2:aaaa:bbbb:cccc:dddd") == "2001:db8:1:2::/64"
    assert limits.address_key("2001:DB8:1:2::1") == limits.address_key("2001:db8:1:2:ffff::9")
    assert limits.address_key("::ffff:192.0.2.1") == "192.0.2.1"  # an IPv4 address, mapped
    assert limits.address_key("192.0.2.1") == "192.0.2.1" != limits.address_key("192.0.2.2")
    assert limits.address_key("-") == "-"
    assert FailureLimits(LimitSettings(ipv6_prefix=56)).address_key("2001:db8:1:2ff::1") == "2001:db8:1:200::/56"
    assert FailureLimits(LimitSettings(ipv6_prefix=128)).address_key("::1") == "::1/128"


def test_the_ipv6_prefix_is_a_prefix_length():
    from tokensvc.config import ConfigError

    with pytest.raises(ConfigError, match=r"^limits.ipv6_prefix: an IPv6 prefix length"):
        make_config(limits={"ipv6_prefix": 129})
    with pytest.raises(ConfigError, match=r"^limits.ipv6_prefix: must be at least 1"):
        make_config(limits={"ipv6_prefix": 0})


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket, as nginx's ``proxy_pass http://unix:/path:`` speaks it."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def through_unix_socket(path: str, target: str, **headers: str) -> int:
    connection = UnixHTTPConnection(path)
    try:
        connection.request("GET", target, headers={"Host": "127.0.0.1", **headers})
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.mark.process
def test_a_proxy_on_this_host_is_believed_through_its_unix_socket_alone(tmp_path):
    """The service also listens on server.unix_socket (mode 0660: only the proxy's group opens
    it), and trusted_networks = ["unix"] believes X-Forwarded-For from that peer alone: a local
    process connecting to the TCP port (from any loopback address, as any may) is taken at its
    own address, whatever it writes. /metrics, open to 203.0.113.0/24 only, tells which."""
    import stat

    import requests
    from service import start_service

    path = tmp_path / "tokensvc.sock"
    service = start_service(tmp_path, extra=f'[server]\nunix_socket = "{path}"\n[proxy]\ntrusted_networks = ["unix"]\n'
                                            '[metrics]\nallow = ["203.0.113.0/24"]\n',
                            env={"TOKENSVC_XHEADERS": "true"})
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o660 and stat.S_ISSOCK(path.stat().st_mode)
        forwarded = {"X-Forwarded-For": "203.0.113.7"}
        assert through_unix_socket(str(path), "/metrics", **forwarded) == 200  # the proxy saw 203.0.113.7
        assert through_unix_socket(str(path), "/metrics") == 404  # the proxy itself is no one
        assert through_unix_socket(str(path), "/healthz") == 200
        assert requests.get(service.base + "/metrics", headers=forwarded, timeout=10).status_code == 404
        assert requests.get(service.base + "/metrics", headers={"X-Real-IP": "203.0.113.7"},
                            timeout=10).status_code == 404
    finally:
        service.stop()
    assert "also listening on unix:" in service.output()


def test_unix_names_the_unix_sockets_peer_and_needs_the_socket():
    from tokensvc.config import ConfigError

    with pytest.raises(ConfigError, match=r'^proxy.trusted_networks: "unix" trusts the peer on server.unix_socket'):
        make_config(xheaders=True, proxy={"trusted_networks": ["unix"]})
    with pytest.raises(ConfigError, match=r"^server.unix_socket_mode: a file mode"):
        make_config(server={"unix_socket": "/run/t.sock", "unix_socket_mode": 0o1777})
    assert make_config(xheaders=True, proxy={"trusted_networks": ["unix", "10.0.0.0/8"]},
                       server={"unix_socket": "/run/t.sock"}).proxy.trusted_networks == ("unix", "10.0.0.0/8")
    # Without a connection's word that it came through the unix socket, 0.0.0.0 is trusted by nothing.
    address = ClientAddress(True, trusted_networks=["unix"])
    assert address(request("0.0.0.0", X_Forwarded_For="203.0.113.7")) == "0.0.0.0"
    assert address(request("127.0.0.1", X_Forwarded_For="203.0.113.7")) == "127.0.0.1"


def test_a_path_that_is_no_socket_is_one_line(tmp_path, capsys, monkeypatch):
    from service import free_port

    from tokensvc.cli import main as cli

    taken = tmp_path / "not-a-socket"
    taken.write_text("kept")
    monkeypatch.setenv("TOKENSVC_SERVER_UNIX_SOCKET", str(taken))
    monkeypatch.setenv("TOKENSVC_ADMIN_PORT", str(free_port()))
    code = cli.main(["serve", "--config", "config/tokensvc.toml", "--port", str(free_port())])
    assert code == 1 and taken.read_text() == "kept"
    assert capsys.readouterr().err == (f"tokensvc: cannot listen on unix:{taken}: a file that is not a socket is "
                                       "there; choose another path with server.unix_socket\n")
