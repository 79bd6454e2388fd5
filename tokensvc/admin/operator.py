"""The operator's actions as JSON, in and out: what the admin API answers
(``tokensvc/handlers/admin.py`` calls :class:`Operator`), and what the CLI runs, either
against a running service over its admin API (:class:`RemoteOperator`) or straight against a
stopped service's store (:class:`Operator`). Both paths run the same bodies through the same
schemas (``tokensvc/admin/schemas.py``) into the same operations (``tokensvc/admin/actions.py``).

Failures: :class:`~tokensvc.admin.actions.Missing` (404), :class:`~tokensvc.admin.actions.Taken` (409),
:class:`~tokensvc.admin.actions.AdminError` and :class:`~tokensvc.errors.ValidationFailed` (422), on
either path: a 422 answer of the admin API is raised as the ValidationFailed it carries.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from tokensvc.admin import actions as admin
from tokensvc.admin import provisioning
from tokensvc.admin import schemas as admin_schemas
from tokensvc.admin.actions import AdminError, ClientSpec, Missing, Taken
from tokensvc.bootstrap import CLI_CLIENT
from tokensvc.config import Settings
from tokensvc.errors import ValidationFailed
from tokensvc.identifiers import own_resource, served_here, username_key
from tokensvc.oauth import sessions
from tokensvc.oauth.context import OAuthContext
from tokensvc.records import Grant, Session
from tokensvc.schemas import load
from tokensvc.storage.base import StorageError

Json = dict[str, Any]
MEMORY_PURGES_ITSELF = ("the memory backend purges its expired codes, tokens and sessions itself every few "
                        "minutes; this purge only came early")


class Operations(Protocol):
    """What the CLI's operator commands call, on either path."""

    async def list_clients(self, limit: int | None = None, cursor: str | None = None) -> Json: ...
    async def get_client(self, client_id: str) -> Json: ...
    async def create_client(self, body: Json) -> Json: ...
    async def put_client(self, client_id: str, body: Json) -> tuple[Json, bool]: ...
    async def patch_client(self, client_id: str, body: Json) -> Json: ...
    async def remove_client(self, client_id: str) -> Json: ...
    async def rotate_secret(self, client_id: str, body: Any) -> Json: ...
    async def list_users(self, limit: int | None = None, cursor: str | None = None) -> Json: ...
    async def get_user(self, username: str) -> Json: ...
    async def create_user(self, body: Json) -> Json: ...
    async def patch_user(self, username: str, body: Json) -> Json: ...
    async def set_password(self, username: str, body: Json) -> Json: ...
    async def remove_user(self, username: str) -> Json: ...
    async def list_installations(self, limit: int | None = None, cursor: str | None = None) -> Json: ...
    async def get_installation(self, installation_id: str) -> Json: ...
    async def put_installation(self, installation_id: str, body: Json) -> tuple[Json, bool]: ...
    async def remove_installation(self, installation_id: str) -> Json: ...
    async def list_grants(self, username: str | None = None, client_id: str | None = None,
                          limit: int | None = None, cursor: str | None = None) -> Json: ...
    async def revoke_grant(self, grant_id: str) -> Json: ...
    async def list_sessions(self, username: str) -> list[Json]: ...
    async def end_session(self, username: str, session_id: str) -> Json: ...
    async def end_sessions(self, username: str) -> Json: ...
    async def revoke_token(self, body: Json) -> Json: ...
    async def introspect(self, body: Json) -> Json: ...
    async def purge(self) -> Json: ...
    async def plan(self, body: Json) -> Json: ...


def _page(items: Sequence[Any], schema: Any, limit: int, key: str) -> Json:
    page = list(items)
    return {"items": schema.dump(page, many=True),
            "next": getattr(page[-1], key) if len(page) == limit and page else None}


def _grant(grant: Grant) -> Json:
    return admin_schemas.grant.dump({"grant_id": grant.grant_id, "client_id": grant.client_id,
                                     "subject_type": grant.subject.kind, "subject": grant.subject.id,
                                     "scopes": grant.scopes, "created_at": grant.created_at})


def _session(session: Session) -> Json:
    return admin_schemas.admin_session.dump({
        "id": session.public_id, "browser": sessions.browser_of(session.user_agent), "user_agent": session.user_agent,
        "address": session.address, "signed_in_at": session.created_at, "last_seen_at": session.last_seen_at})


def file_entries(settings: Settings) -> admin.FileEntries:
    """The entries the configuration file of ``settings`` writes at every start (bootstrap.seed):
    the file's own, which no operation changes."""
    return admin.FileEntries(settings.config_file, frozenset(seed.client_id for seed in settings.clients),
                             frozenset(username_key(seed.username) for seed in settings.users),
                             frozenset(seed.installation_id for seed in settings.installations),
                             CLI_CLIENT.client_id if settings.admin.cli_client else "")


class Operator:
    """The operations over one service's store (``ctx``): the admin API's, and the CLI's on a
    stopped service. Neither changes an entry of the configuration file (:func:`file_entries`)."""

    def __init__(self, ctx: OAuthContext, settings: Settings) -> None:
        self.ctx, self.store, self.settings = ctx, ctx.store, settings
        self.service_name = settings.service_name
        self.file = file_entries(settings)

    # -- clients

    async def list_clients(self, limit: int | None = None, cursor: str | None = None) -> Json:
        size = admin.page_size(limit)
        return _page(await self.store.list_clients(cursor, size), admin_schemas.admin_client, size, "client_id")

    async def get_client(self, client_id: str) -> Json:
        client = await admin.get_client(self.store, client_id)
        return admin_schemas.admin_client_shown.dump((client, await admin.previous_secret(self.store, client,
                                                                                              self.ctx.clock())))

    async def create_client(self, body: Json) -> Json:
        data = load(admin_schemas.client_body, self._logo_served_here(body))
        client_id = data.pop("client_id", None)
        client, secret = await admin.create_client(self.store, ClientSpec(**data), client_id, self.ctx.events.publish,
                                                   self.ctx.clock(), self.ctx.clock, own=own_resource(self.ctx.issuer))
        self.ctx.origins.forget()
        return {**admin_schemas.admin_client.dump(client), "clientSecret": secret}

    async def put_client(self, client_id: str, body: Json) -> tuple[Json, bool]:
        data = load(admin_schemas.client_body, self._logo_served_here(body))
        if data.pop("client_id", client_id) != client_id:
            raise AdminError(f"the body's clientId differs from the address's {client_id!r}", "clientId")
        await self.file.refuse(self.store, "client", client_id)
        client, secret, created = await admin.put_client(self.ctx, client_id, ClientSpec(**data))
        self.ctx.origins.forget()
        return {**admin_schemas.admin_client.dump(client), "clientSecret": secret}, created

    async def patch_client(self, client_id: str, body: Json) -> Json:
        changes = load(admin_schemas.client_patch, self._logo_served_here(body))
        await self.file.refuse(self.store, "client", client_id)
        client, secret = await admin.update_client(self.ctx, client_id, changes)
        self.ctx.origins.forget()
        return {**admin_schemas.admin_client.dump(client), "clientSecret": secret}

    def _logo_served_here(self, body: Any) -> Any:
        """A client body with its logo given as a path made the URL this service serves it at,
        as the configuration makes it (:func:`~tokensvc.identifiers.served_here`)."""
        if isinstance(body, dict) and isinstance(body.get("logoUrl"), str):
            return {**body, "logoUrl": served_here(body["logoUrl"], self.settings.auth_url)}
        return body

    async def remove_client(self, client_id: str) -> Json:
        await self.file.refuse(self.store, "client", client_id)
        revoked = await admin.remove_client(self.ctx, client_id)
        self.ctx.origins.forget()
        return {"removed": client_id, "grantsRevoked": revoked}

    async def rotate_secret(self, client_id: str, body: Any) -> Json:
        keep = load(admin_schemas.secret_body, body)["keep_previous_seconds"]
        await self.file.refuse(self.store, "client", client_id)
        secret, previous = await admin.rotate_secret(self.ctx, client_id, keep)
        return admin_schemas.secret_rotated.dump({"client_id": client_id, "client_secret": secret,
                                                  "previous_secret_expires_at": previous and previous.expires_at})

    # -- users

    async def list_users(self, limit: int | None = None, cursor: str | None = None) -> Json:
        size = admin.page_size(limit)
        return _page(await self.store.list_users(cursor, size), admin_schemas.admin_user, size, "username")

    async def get_user(self, username: str) -> Json:
        return admin_schemas.admin_user.dump(await admin.get_user(self.store, username))

    async def create_user(self, body: Json) -> Json:
        data = load(admin_schemas.user_body, body)
        user = await admin.create_user(self.store, data["username"], data.get("password"), admin=data["admin"],
                                       service_name=self.service_name, password_hash=data.get("password_hash"))
        return admin_schemas.admin_user.dump(user)

    async def patch_user(self, username: str, body: Json) -> Json:
        data = load(admin_schemas.user_patch, body)
        await self.file.refuse(self.store, "user", username)
        return admin_schemas.admin_user.dump(await admin.set_admin(self.ctx, username, data["admin"]))

    async def set_password(self, username: str, body: Json) -> Json:
        data = load(admin_schemas.password_body, body)
        await self.file.refuse(self.store, "user", username)
        done = await admin.set_password(self.ctx, username, data.get("password"), keep_grants=data["keep_grants"],
                                        service_name=self.service_name, password_hash=data.get("password_hash"))
        return {"username": done["username"], "sessionsEnded": done["sessions_ended"],
                "familiesRevoked": done["families_revoked"]}

    async def remove_user(self, username: str) -> Json:
        await self.file.refuse(self.store, "user", username)
        removed, revoked = await admin.remove_user(self.ctx, username)
        return {"removed": removed, "familiesRevoked": revoked}

    # -- installations

    async def _installation(self, installation: Any) -> Json:
        names = [(await self.store.get_user(user_id)) for user_id in installation.operators]
        return admin_schemas.admin_installation.dump({
            "installation_id": installation.installation_id, "name": installation.name, "kind": installation.kind,
            "operators": [user.username for user in names if user is not None]})

    async def list_installations(self, limit: int | None = None, cursor: str | None = None) -> Json:
        size = admin.page_size(limit)
        page = await self.store.list_installations(cursor, size)
        return {"items": [await self._installation(inst) for inst in page],
                "next": page[-1].installation_id if len(page) == size and page else None}

    async def get_installation(self, installation_id: str) -> Json:
        return await self._installation(await admin.get_installation(self.store, installation_id))

    async def put_installation(self, installation_id: str, body: Json) -> tuple[Json, bool]:
        data = load(admin_schemas.installation_body, body)
        await self.file.refuse(self.store, "installation", installation_id)
        installation, created = await admin.put_installation(self.store, installation_id, data["name"], data["kind"],
                                                             data.get("operators") or [],
                                                             self.settings.installation_kinds)
        return await self._installation(installation), created

    async def remove_installation(self, installation_id: str) -> Json:
        await self.file.refuse(self.store, "installation", installation_id)
        return {"removed": installation_id,
                "familiesRevoked": await admin.remove_installation(self.ctx, installation_id)}

    # -- grants, sessions, tokens, housekeeping

    async def list_grants(self, username: str | None = None, client_id: str | None = None,
                          limit: int | None = None, cursor: str | None = None) -> Json:
        size = admin.page_size(limit)
        page = await admin.list_grants(self.ctx, username, client_id, cursor, size)
        return {"items": [_grant(grant) for grant in page], "next": page[-1].grant_id if len(page) == size else None}

    async def revoke_grant(self, grant_id: str) -> Json:
        return {"revoked": grant_id, "familiesRevoked": await admin.revoke_one_grant(self.ctx, grant_id)}

    async def list_sessions(self, username: str) -> list[Json]:
        return [_session(session) for session in await admin.list_sessions(self.ctx, username)]

    async def end_session(self, username: str, session_id: str) -> Json:
        await admin.end_session(self.ctx, username, session_id)
        return {"ended": 1}

    async def end_sessions(self, username: str) -> Json:
        return {"ended": await admin.end_sessions(self.ctx, username)}

    async def revoke_token(self, body: Json) -> Json:
        return {"revoked": await admin.revoke_token_value(self.ctx, load(admin_schemas.token_body, body)["token"])}

    async def introspect(self, body: Json) -> Json:
        return await admin.introspect(self.ctx, load(admin_schemas.token_body, body)["token"])

    async def purge(self) -> Json:
        counts: Json = await admin.purge(self.store)
        if self.settings.storage.backend == "memory":
            counts["note"] = MEMORY_PURGES_ITSELF
        return counts

    async def plan(self, body: Json, acting_user: str | None = None, acting_client: str | None = None) -> Json:
        """What applying the desired state ``body`` would do (:mod:`tokensvc.admin.provisioning`); the
        configuration file's entries (the service's own client among them) are neither changed
        nor pruned, nor the caller's user and client pruned."""
        if isinstance(body, dict) and isinstance(body.get("clients"), list):
            body = {**body, "clients": [self._logo_served_here(entry) for entry in body["clients"]]}
        steps = await provisioning.plan(self.store, body, kinds=self.settings.installation_kinds,
                                        service_name=self.service_name, acting_user=acting_user,
                                        acting_client=acting_client, file=self.file,
                                        own=own_resource(self.ctx.issuer))
        return {"steps": [step.json() for step in steps]}


# -- over the admin API ------------------------------------------------------------------------


class Unreachable(Exception):
    """The admin listener did not answer at all (nothing listens there, or no way reaches it):
    one line naming it and what to check (:func:`unreachable`)."""


def unreachable(url: str, reason: object) -> str:
    """Why the admin listener at ``url`` was not reached (``reason``: the connection's error),
    and what to check: the service, its listener's address and the way there."""
    why = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
    return (f"the admin listener at {url} does not answer ({why}): check that tokensvc serve runs with its admin "
            "listener there (admin.host, admin.port; with kubectl port-forward or an SSH tunnel, that the tunnel "
            "is open), and that --url or TOKENSVC_ADMIN_URL names it")


class RemoteOperator:
    """The same operations, asked of a running service's admin API with an access token."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url.rstrip("/"), token

    async def _call(self, method: str, path: str, body: Json | None = None, query: dict[str, Any] | None = None) -> Any:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        query = {key: value for key, value in (query or {}).items() if value is not None}
        url = self.url + path + ("?" + urlencode(query) if query else "")
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            response = await AsyncHTTPClient().fetch(url, method=method, headers=headers, raise_error=False,
                                                     body=json.dumps(body) if body is not None else None,
                                                     allow_nonstandard_methods=True)
        except (OSError, HTTPClientError) as exc:
            raise Unreachable(unreachable(self.url, exc)) from None
        if response.code == 599:
            raise Unreachable(unreachable(self.url, response.error))
        answer = json.loads(response.body or b"{}") if response.body else {}
        if response.code >= 400:
            raise _failure(response.code, answer)
        return answer

    async def list_clients(self, limit: int | None = None, cursor: str | None = None) -> Json:
        return await self._call("GET", "/admin/clients", query={"limit": limit, "cursor": cursor})

    async def get_client(self, client_id: str) -> Json:
        return await self._call("GET", f"/admin/clients/{quote(client_id, safe='')}")

    async def create_client(self, body: Json) -> Json:
        return await self._call("POST", "/admin/clients", body)

    async def put_client(self, client_id: str, body: Json) -> tuple[Json, bool]:
        answer = await self._call("PUT", f"/admin/clients/{quote(client_id, safe='')}", body)
        return answer, bool(answer.get("created"))

    async def patch_client(self, client_id: str, body: Json) -> Json:
        return await self._call("PATCH", f"/admin/clients/{quote(client_id, safe='')}", body)

    async def remove_client(self, client_id: str) -> Json:
        return await self._call("DELETE", f"/admin/clients/{quote(client_id, safe='')}")

    async def rotate_secret(self, client_id: str, body: Any) -> Json:
        return await self._call("POST", f"/admin/clients/{quote(client_id, safe='')}/secret", body)

    async def list_users(self, limit: int | None = None, cursor: str | None = None) -> Json:
        return await self._call("GET", "/admin/users", query={"limit": limit, "cursor": cursor})

    async def get_user(self, username: str) -> Json:
        return await self._call("GET", f"/admin/users/{quote(username, safe='')}")

    async def create_user(self, body: Json) -> Json:
        return await self._call("POST", "/admin/users", body)

    async def patch_user(self, username: str, body: Json) -> Json:
        return await self._call("PATCH", f"/admin/users/{quote(username, safe='')}", body)

    async def set_password(self, username: str, body: Json) -> Json:
        return await self._call("PUT", f"/admin/users/{quote(username, safe='')}/password", body)

    async def remove_user(self, username: str) -> Json:
        return await self._call("DELETE", f"/admin/users/{quote(username, safe='')}")

    async def list_installations(self, limit: int | None = None, cursor: str | None = None) -> Json:
        return await self._call("GET", "/admin/installations", query={"limit": limit, "cursor": cursor})

    async def get_installation(self, installation_id: str) -> Json:
        return await self._call("GET", f"/admin/installations/{quote(installation_id, safe='')}")

    async def put_installation(self, installation_id: str, body: Json) -> tuple[Json, bool]:
        answer = await self._call("PUT", f"/admin/installations/{quote(installation_id, safe='')}", body)
        return answer, bool(answer.get("created"))

    async def remove_installation(self, installation_id: str) -> Json:
        return await self._call("DELETE", f"/admin/installations/{quote(installation_id, safe='')}")

    async def list_grants(self, username: str | None = None, client_id: str | None = None,
                          limit: int | None = None, cursor: str | None = None) -> Json:
        return await self._call("GET", "/admin/grants", query={"username": username, "clientId": client_id,
                                                                "limit": limit, "cursor": cursor})

    async def revoke_grant(self, grant_id: str) -> Json:
        return await self._call("DELETE", f"/admin/grants/{quote(grant_id, safe='')}")

    async def list_sessions(self, username: str) -> list[Json]:
        return await self._call("GET", f"/admin/users/{quote(username, safe='')}/sessions")

    async def end_session(self, username: str, session_id: str) -> Json:
        return await self._call(
            "DELETE", f"/admin/users/{quote(username, safe='')}/sessions/{quote(session_id, safe='')}")

    async def end_sessions(self, username: str) -> Json:
        return await self._call("DELETE", f"/admin/users/{quote(username, safe='')}/sessions")

    async def revoke_token(self, body: Json) -> Json:
        return await self._call("POST", "/admin/tokens/revoke", body)

    async def introspect(self, body: Json) -> Json:
        return await self._call("POST", "/admin/tokens/introspect", body)

    async def purge(self) -> Json:
        return await self._call("POST", "/admin/purge")

    async def plan(self, body: Json) -> Json:
        return await self._call("POST", "/admin/plan", body)


def _failure(status: int, answer: Any) -> Exception:
    """The operation's exception for an error answer of the admin API."""
    detail = answer.get("detail") if isinstance(answer, dict) else None
    if status == 422 and isinstance(detail, list) and detail:
        return ValidationFailed(detail)  # every problem, located, as the store path raises them
    if isinstance(detail, str):
        message = detail
    elif isinstance(answer, dict) and "error" in answer:
        message = answer.get("error_description") or answer["error"]
    else:
        message = f"the admin API answered {status}"
    if status == 404:
        return Missing(message)
    if status == 409:
        return Taken(message)
    if status in (401, 403):
        return AdminError(f"not allowed ({status}): {message}; sign in again with `tokensvc login`")
    if status == 503:
        return StorageError(message)
    return AdminError(message)
