"""The host a request names (handlers/edge/guards.py, docs/security.md "The host a request names"):
each listener answers its own names and the loopback names, whatever the public URLs say, and
refuses every other name (DNS rebinding)."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import make_config
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from tokensvc.app import make_admin_app, make_app
from tokensvc.bootstrap import make_context, seed
from tokensvc.handlers.edge import guards
from tokensvc.storage.memory import MemoryStore

pytestmark = pytest.mark.gen_test

# A production deployment's public URL, as deploy/tokensvc.toml and docs/guide/quickstart.md give it.
PUBLIC = make_config(base_url="https://auth.example.org", auth_url="https://auth.example.org",
                     server={"allowed_hosts": ["tokensvc", "tokensvc.web.svc.cluster.local", "10.9.0.4"]})


async def served(http_client, application, host, path):
    """The status of ``path`` asked of ``application`` naming ``host`` in ``Host``."""
    sock, port = bind_unused_port()
    server = HTTPServer(application)
    server.add_sockets([sock])
    try:
        response = await http_client.fetch(f"http://127.0.0.1:{port}{path}", headers={"Host": host},
                                           raise_error=False)
    finally:
        server.stop()
    return response.code


def applications(settings):
    store = MemoryStore()
    ctx = make_context(settings, store)
    return store, make_app(settings, store, ctx), make_admin_app(settings, store, ctx)


@pytest.mark.parametrize("host", ["127.0.0.1:8081", "localhost:8081", "[::1]:8081", "127.0.0.1", "LOCALHOST"])
async def test_the_admin_listener_answers_the_loopback_names_whatever_the_public_url(http_client, io_loop, host):
    """``kubectl port-forward`` and an SSH tunnel reach the admin listener at 127.0.0.1 or
    localhost: with a public URL that is not on loopback (deploy/'s, the quickstart's) the
    listener answered those 400, and ``tokensvc login`` could not start."""
    store, _, admin = applications(PUBLIC)
    await seed(store, PUBLIC)
    assert await served(http_client, admin, host, "/admin") == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8081", "auth.example.org.evil.example",
                                  "localhost.evil.example", "127.0.0.1.nip.io"])
async def test_the_admin_listener_still_refuses_a_name_nobody_gave_it(http_client, host):
    _, _, admin = applications(PUBLIC)
    assert await served(http_client, admin, host, "/admin") == 400
    assert await served(http_client, admin, host, "/openapi.json") == 400


async def test_the_admin_listener_answers_its_own_address(http_client):
    """Bound to an address of its own (admin.allow_remote), the listener answers that address;
    bound to every address, any address (what a client names by address is never a name an
    attacker's DNS gives: a browser sends an address only for a page from that very address)."""
    own = dataclasses.replace(PUBLIC, admin=dataclasses.replace(PUBLIC.admin, host="10.1.2.3", allow_remote=True))
    _, _, admin = applications(own)
    assert await served(http_client, admin, "10.1.2.3:8081", "/admin") == 200
    assert await served(http_client, admin, "10.1.2.4:8081", "/admin") == 400
    assert await served(http_client, admin, "evil.example", "/admin") == 400
    everywhere = dataclasses.replace(PUBLIC, admin=dataclasses.replace(PUBLIC.admin, host="0.0.0.0",
                                                                       allow_remote=True))
    _, _, admin = applications(everywhere)
    for host in ("10.1.2.4:8081", "[fd00::7]:8081", "192.168.1.9"):
        assert await served(http_client, admin, host, "/admin") == 200, host
    assert await served(http_client, admin, "evil.example", "/admin") == 400
    # The public listener's names stay the public listener's: its own address is not the admin's.
    _, public, _ = applications(everywhere)
    assert await served(http_client, public, "10.1.2.4:8080", "/oauth/clients") == 400


@pytest.mark.parametrize("host", ["127.0.0.1:8080", "localhost:8080", "[::1]:8080"])
async def test_the_public_listener_answers_the_loopback_names_whatever_the_public_url(http_client, host):
    """The quickstart's own scrape (``curl http://127.0.0.1:8080/metrics`` on the instance) got
    400 with its own configuration: a loopback name is never one a rebinding page gives."""
    _, public, _ = applications(PUBLIC)
    for path in ("/metrics", "/oauth/clients", "/.well-known/oauth-authorization-server"):
        assert await served(http_client, public, host, path) == 200, path


@pytest.mark.parametrize("host,status", [
    ("auth.example.org.", 200), ("auth.example.org.:443", 200), ("tokensvc.web.svc.cluster.local.", 200),
    ("tokensvc.web.svc.cluster.local.:8080", 200), ("tokensvc.", 200), ("localhost.", 200),
    ("auth.example.org..", 400), ("evil.example.", 400), (".", 400),
])
async def test_a_name_with_its_final_dot_is_the_same_name(http_client, host, status):
    """A fully qualified name written with its final dot (``tokensvc.ns.svc.cluster.local.``,
    as resolvers write it) names the same host; one dot, not any number of them."""
    _, public, admin = applications(PUBLIC)
    assert await served(http_client, public, host, "/oauth/clients") == status
    assert await served(http_client, admin, host, "/admin") == status


def test_the_names_each_listener_answers():
    public = guards.allowed_hosts(PUBLIC)
    assert public is not None and {"auth.example.org", "tokensvc", "10.9.0.4", *guards.LOOPBACK_NAMES} <= public
    admin = guards.allowed_hosts(PUBLIC, admin=True)
    assert admin is not None and public | {"127.0.0.1"} == admin
    star = make_config(server={"allowed_hosts": ["*"]})
    assert guards.allowed_hosts(star) is None and guards.allowed_hosts(star, admin=True) is None
