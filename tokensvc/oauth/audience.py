"""Audience-bound tokens (RFC 8707, resource indicators): which APIs a token is meant for.

A resource server declares the resource URIs of the API it serves (``Client.resources``);
tokensvc's own API is one too (:func:`own`, ``base_url`` + ``/v1``). An authorization request, a
code exchange and a refresh may name ``resource`` (repeatable): each must be an absolute URI
without a fragment (§2), declared by a resource server or tokensvc's own, else
``invalid_target``. The code keeps what the authorization request named, and so does the
family's refresh token; an exchange or a refresh may narrow the access token it issues
(§2.2), never widen it, so one refresh token serves each of those APIs in turn. A token that
names none is meant for every API, as before audiences.

Binding needs a store whose every process reads a family's audience
(:meth:`~tokensvc.storage.base.Housekeeping.binds_audiences`: on MongoDB, once ``tokensvc storage
finalize`` raised it to format 3). Before, a request naming ``resource`` is refused
(``invalid_target``, saying why) rather than answered with a token for every API: the client
asked for less than that (RFC 8707 §2: the server SHOULD restrict what it issues), and a
release that ignored the audience would accept the token everywhere.
"""

from __future__ import annotations

from tokensvc.identifiers import OWN_RESOURCE_PATH, own_resource, resource_uri_problem
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import InvalidTarget
from tokensvc.records import Token

OWN_PATH = OWN_RESOURCE_PATH  # tokensvc's own API, a resource at base_url + OWN_PATH
MAX_RESOURCES = 16
NOT_YET = ("tokens are bound to a resource only once the store's format allows it (tokensvc storage "
           "finalize); ask without resource")


def own(ctx: OAuthContext) -> str:
    """tokensvc's own API as a resource (its ``/v1``)."""
    return own_resource(ctx.issuer)


def parse(values: list[str]) -> list[str] | None:
    """The resources a request names (None: none), in order, each once; ``invalid_target``
    for one that is malformed."""
    if not values:
        return None
    if len(values) > MAX_RESOURCES:
        raise InvalidTarget(f"At most {MAX_RESOURCES} resource parameters")
    for value in values:
        why = resource_uri_problem(value)
        if why is not None:
            raise InvalidTarget(f"resource: {why}")
    return list(dict.fromkeys(values))


async def requested(ctx: OAuthContext, values: list[str], held: list[str] | None = None) -> list[str] | None:
    """The audience a request asks for by its ``resource`` values: None when it names none;
    else each one, which must be declared (by a resource server, or tokensvc's own) and within
    ``held``, what the code or the family already holds (None: every API), and the store must
    bind audiences. ``invalid_target`` otherwise."""
    asked = parse(values)
    if asked is None:
        return None
    if held is not None:
        beyond = [resource for resource in asked if resource not in held]
        if beyond:
            raise InvalidTarget("Not among the resources granted: " + " ".join(beyond))
    else:
        mine = own(ctx)
        declared = await ctx.store.declared_resources([resource for resource in asked if resource != mine])
        unknown = [resource for resource in asked if resource != mine and resource not in declared]
        if unknown:
            raise InvalidTarget("No API serves: " + " ".join(unknown))
    if not await ctx.store.binds_audiences():
        raise InvalidTarget(NOT_YET)
    return asked


def for_tokensvc(ctx: OAuthContext, token: Token) -> bool:
    """Whether ``token`` may be used at tokensvc's own API (``/v1``, the admin API, and
    introspection by an administrator's token)."""
    return token.meant_for([own(ctx)])
