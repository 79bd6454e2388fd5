"""Where a request may come from: the host it names, the origin a browser says it comes from,
and the XSRF proof of a request the session cookie may authorize. Every such decision of the
web edge is made here, for every route:

- :class:`Hosts` (``Host``): only the service's configured names, the loopback names and, on
  the admin listener, its own address are answered (a rebinding page's name is not), except
  by the probes of a load balancer (:data:`HOST_FREE`);
- :func:`check_xsrf`: an unsafe request the cookie may authorize comes from the service's own
  origin and repeats its XSRF token (:mod:`.xsrf`);
- :func:`check_socket_origin`: a WebSocket the cookie authorizes is opened by the service's own
  pages.

Which other origins may *read* an answer is CORS's business (:mod:`.cors`), not a guard's.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from tornado.httputil import HTTPServerRequest

from tokensvc import errors
from tokensvc.config import Settings
from tokensvc.handlers.edge import xsrf
from tokensvc.handlers.edge.inputs import HTML, RequestInput
from tokensvc.handlers.edge.routes import UNSAFE_METHODS

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("", "0.0.0.0", "::")  # a listener on every address of the machine
HOST_FREE = ("/healthz", "/readyz")  # what a load balancer's probe asks by the instance's own address


# -- the host a request names ---------------------------------------------------------------


class Hosts:
    """The host names a request may name: those of the public URLs and
    ``server.allowed_hosts`` (any, with ``*``), and the loopback names, on either listener. The
    admin listener (``admin=True``) also answers its own address: ``admin.host``, or any
    address where it listens on every one.

    None of these is a name a rebinding page can give. Such a page is the attacker's, at a
    name of the attacker's DNS, and a browser names that host in every request the page makes.
    A browser names a loopback name or an address only for a page it loaded from that name or
    address and port: the service itself (docs/security.md, The host a request names)."""

    def __init__(self, config: Settings, admin: bool = False) -> None:
        self.names = allowed_hosts(config, admin=admin)
        self.any_address = admin and config.admin.host in WILDCARDS

    def refusal(self, request: HTTPServerRequest, route_path: str) -> errors.HTTPAnswer | None:
        """The answer to a request naming a host the service does not answer to; None if it may."""
        if self.names is None or route_path in HOST_FREE:
            return None
        name = host_name(request)
        if name in self.names or (self.any_address and is_address(name)):
            return None
        return errors.BadRequest("Unknown host: this service answers to its configured names only")


def host_name(request: HTTPServerRequest) -> str:
    """The host ``request`` names, as the service compares names: in lower case, without the
    port or an IPv6 address's brackets, and without the final dot of a fully qualified name
    (``tokensvc.ns.svc.cluster.local.`` is ``tokensvc.ns.svc.cluster.local``; one dot only)."""
    return _plain_name(request.host_name)


def _plain_name(name: str) -> str:
    return name.lower().strip("[]").removesuffix(".")


def is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def allowed_hosts(config: Settings, admin: bool = False) -> frozenset[str] | None:
    """The host names a request may name (None: any), on the public listener or the admin one."""
    if "*" in config.server.allowed_hosts:
        return None
    names = {_plain_name(urlsplit(url).hostname or "") for url in (config.base_url, config.auth_url)}
    names.update(_plain_name(host) for host in config.server.allowed_hosts)
    names.update(LOOPBACK_NAMES)
    if admin and config.admin.host not in WILDCARDS:
        names.add(_plain_name(config.admin.host))
    names.discard("")
    return frozenset(names)


# -- the origin a browser says a request comes from -------------------------------------------


def own_origins(config: Settings) -> frozenset[str]:
    """The service's public origins (scheme, host and port of ``base_url`` and ``auth_url``)."""
    return frozenset(_origin(url) for url in (config.base_url, config.auth_url))


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def from_own_origin(request: HTTPServerRequest, config: Settings) -> bool:
    """Whether the browser says the request comes from the service's own origin, or says
    nothing at all (not a browser: a token decides). ``Sec-Fetch-Site`` first; else
    ``Origin``, which the service's pages send as their own (``Referrer-Policy: same-origin``):
    ``Origin: null`` (a sandboxed frame, a ``data:`` page, a page under no-referrer) says
    nothing of where the request comes from and is refused."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("Origin")
    return origin is None or origin in own_origins(config)


# -- the decisions ------------------------------------------------------------------------------


def check_xsrf(handler: RequestInput) -> None:
    """Every unsafe request that the session cookie may authorize must prove it came from this
    service's own pages: on a page, always (a sign-in form too: login CSRF); on a JSON route,
    when it carries the cookie. A request to a route where an ``Authorization`` header takes
    the cookie's place (``bearer_replaces_cookie``: the ``/v1`` API's bearer tokens)
    authenticates by that header: the one exemption. Any other route that acts on the cookie
    (sign-out) asks for the token whatever else the request carries. Routes that never read the
    cookie (``reads_session = False``) are not asked.

    The proof is twofold. Where the browser says where the request comes from
    (``Sec-Fetch-Site``, ``Origin``), it must be this service's own origin: a sibling subdomain
    or a page on plain http that planted a cookie is another origin. And the request repeats
    the XSRF token (:mod:`.xsrf`), signed for its session."""
    request = handler.request
    if request.method not in UNSAFE_METHODS or not handler.reads_session:
        return
    config = handler.config
    if handler.output != HTML and (("Authorization" in request.headers and handler.bearer_replaces_cookie)
                                   or config.session_cookie not in request.cookies):
        return
    if not from_own_origin(request, config):
        raise errors.XsrfFailed()
    sent = [value for value in request.body_arguments.get(xsrf.FIELD, []) if value]  # empty: absent
    submitted = sent[-1].decode("ascii", "replace") if sent else request.headers.get(xsrf.HEADER)
    if not xsrf.matches(request, config.xsrf_cookie, config.cookie_secrets, handler.raw_session_id(), submitted):
        raise errors.XsrfFailed()


def check_socket_origin(request: HTTPServerRequest, config: Settings, via_cookie: bool) -> None:
    """A WebSocket that the session cookie authorizes must be opened by the service's own pages
    (the cookie is ambient: any page the browser shows would send it); one that a bearer token
    authorizes may come from anywhere (the token is explicit). Forbidden otherwise."""
    if via_cookie and not from_own_origin(request, config):
        raise errors.Forbidden("A WebSocket authorized by the session cookie must come from this "
                               "service's own origin")
