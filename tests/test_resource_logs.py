"""A token in a request's query never reaches a resource server's log: the ASGI middleware
served by uvicorn (its access log and its WebSocket lines), the Starlette backend served by
uvicorn (its WebSocket route behind the ASGI middleware), and the Tornado adapter's application
served by Tornado (its access log and its lines of an uncaught exception), each a process of its
own with its logging as it ships, every path: HTTP and WebSocket, refused, accepted, exempt, a
handler without the mixin, one that fails, a path no handler serves (404), with a header beside
the query, and the name written escaped in every way a query parser still reads as
``access_token``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from helpers import DEADLINE, WEBAPP_SECRET, eventually
from service import end, free_port, spawn
from test_ws import tokens
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from tokensvc.resource.bearer import masked_query

ASGI_APP = """
import os

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route, WebSocketRoute

from tokensvc.resource import Settings, Verifier
from tokensvc.resource.asgi import BearerAuthMiddleware

verifier = Verifier(Settings(os.environ["TOKENSVC_URL"], "webapp", os.environ["SECRET"]))


async def notes(request):
    return JSONResponse({"scopes": request.auth.scopes})


async def healthz(request):
    return PlainTextResponse("ok")


async def live(websocket):
    await websocket.accept()
    await websocket.send_text("hello")
    await websocket.receive()  # until the client closes


app = Starlette(routes=[Route("/notes", notes), Route("/healthz", healthz), WebSocketRoute("/live", live)],
                middleware=[Middleware(BearerAuthMiddleware, verifier=verifier, scope="read",
                                       exempt=("/healthz",))])
"""

STARLETTE_APP = """
import os

from starlette.applications import Starlette
from starlette.authentication import requires
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route, WebSocketRoute

from tokensvc.resource import Settings, Verifier
from tokensvc.resource.asgi import BearerAuthMiddleware
from tokensvc.resource.starlette import EXCEPTION_HANDLERS, authentication

verifier = Verifier(Settings(os.environ["TOKENSVC_URL"], "webapp", os.environ["SECRET"]))


@requires("read")
async def notes(request):
    return JSONResponse({"scopes": list(request.auth.scopes)})


async def healthz(request):
    return PlainTextResponse("ok")


async def live(websocket):
    await websocket.accept()
    await websocket.send_text("hello")
    await websocket.receive()  # until the client closes


app = Starlette(routes=[Route("/notes", notes), Route("/healthz", healthz),
                        WebSocketRoute("/live", live, middleware=[Middleware(BearerAuthMiddleware, verifier=verifier,
                                                                             scope="read")])],
                middleware=[authentication(verifier)], exception_handlers=EXCEPTION_HANDLERS)
"""

TORNADO_APP = """
import asyncio
import logging
import os

import tornado.web

from tokensvc.resource import Settings, Verifier
from tokensvc.resource.tornado import Application, BearerAuthMixin, RevocableWebSocket, requires


class Notes(BearerAuthMixin):
    @requires("read")
    async def get(self):
        self.write({"scopes": self.authorized.scopes})


class Health(BearerAuthMixin):  # served without a token
    def get(self):
        self.write("ok")


class Live(RevocableWebSocket):
    required_scope = "read"

    def open(self):
        self.write_message("hello")


class Plain(tornado.web.RequestHandler):  # no mixin: served by the application alone
    def get(self):
        self.write("plain")


class Fails(tornado.web.RequestHandler):  # an uncaught exception: its line names the request
    def get(self):
        raise RuntimeError("fails")


async def main():
    logging.basicConfig(level=logging.INFO)  # every access line, not only the refusals
    verifier = Verifier(Settings(os.environ["TOKENSVC_URL"], "webapp", os.environ["SECRET"]))
    await verifier.start()
    app = Application([("/notes", Notes), ("/healthz", Health), ("/live", Live), ("/plain", Plain),
                       ("/fails", Fails)], tokensvc_verifier=verifier)
    app.listen(int(os.environ["PORT"]), "127.0.0.1")
    await asyncio.Event().wait()


asyncio.run(main())
"""

SECRET = "a-query-token-" + "q" * 30  # a token no one issued
ESCAPED = ["access%5Ftoken", "access%5ftoken", "ACCESS_TOKEN", "%61ccess%5Ftoken", "access_token+", "+access_token",
           "access_token%00", "access_token%20", "access%2500_token", "access_token%E2%80%8B"]


def test_masked_query_masks_every_spelling_a_parser_reads_and_keeps_the_rest():
    from urllib.parse import parse_qsl

    for name in ESCAPED + ["access_token"]:
        query = f"x=a%2Fb+c&{name}={SECRET}&flag&y=%FF"
        masked = masked_query(query)
        assert masked == "x=a%2Fb+c&access_token=***&flag&y=%FF", name
        assert SECRET not in masked
    assert masked_query(f"x=1;access_token={SECRET}") == "x=1;access_token=***"
    untouched = "q=tokens&access=1&my_access_token=x&access_token_hint=y&z=%7E"
    assert masked_query(untouched) == untouched  # another name: left as it came, byte for byte
    assert masked_query("") == ""
    assert dict(parse_qsl(masked_query(f"a=1&access%5Ftoken={SECRET}"))) == {"a": "1", "access_token": "***"}


def masked_target(target: str) -> str:
    path, _, query = target.partition("?")
    return f"{path}?{masked_query(query)}"


async def started_server(kind, tmp_path, base_url, http_client):
    """The program of ``kind``, served on a free port as an integrator serves it: uvicorn with
    its default logging (the ASGI middleware's program, or the Starlette backend's), or the
    Tornado program; its process and its URL once it answers."""
    port = free_port()
    environ = {**os.environ, "TOKENSVC_URL": base_url, "SECRET": WEBAPP_SECRET, "PORT": str(port)}
    if kind in ("uvicorn", "starlette"):
        (tmp_path / "notes_asgi.py").write_text(ASGI_APP if kind == "uvicorn" else STARLETTE_APP)
        command = [sys.executable, "-m", "uvicorn", "notes_asgi:app", "--port", str(port)]
    else:
        (tmp_path / "notes_tornado.py").write_text(TORNADO_APP)
        command = [sys.executable, "notes_tornado.py"]
    process = spawn(command, cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    api = f"http://127.0.0.1:{port}"

    async def answers():
        assert process.poll() is None, end(process)
        try:
            return (await http_client.fetch(api + "/healthz", raise_error=False)).code == 200
        except OSError:  # not listening yet
            return False

    await eventually(answers, DEADLINE, what=f"{kind} serving")
    return process, api


@pytest.mark.e2e
@pytest.mark.gen_test(timeout=120)
@pytest.mark.parametrize("kind", ["uvicorn", "starlette", "tornado"])
async def test_a_query_token_never_reaches_the_servers_log(kind, tmp_path, browser, http_client, base_url):
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    bearer = {"Authorization": f"Bearer {access}"}
    process, api = await started_server(kind, tmp_path, base_url, http_client)
    ws = api.replace("http://", "ws://")
    logged_as: list[str] = []  # what each request's target must be in the log
    try:
        async def get(target, headers=None):
            logged_as.append(masked_target(target))
            return await http_client.fetch(api + target, headers=headers, raise_error=False)

        response = await get(f"/notes?access_token={SECRET}")
        assert response.code == 401  # HTTP takes no token from the query (RFC 6750 §2.3): only masked
        response = await get(f"/notes?x=1&access_token={SECRET}", bearer)
        assert response.code == 200 and json.loads(response.body) == {"scopes": ["read"]}
        for name in ESCAPED:
            assert (await get(f"/notes?{name}={SECRET}")).code == 401
        assert (await get(f"/healthz?access_token={SECRET}")).code == 200
        if kind == "tornado":  # requests no mixin handler serves: masked by the application
            for target in (f"/plain?access_token={SECRET}", f"/plain?access%5Ftoken={SECRET}"):
                assert (await get(target)).body == b"plain"
            for target in (f"/fails?access_token={SECRET}", f"/fails?x=1&access%5Ftoken={SECRET}"):
                assert (await get(target)).code == 500
            for target in (f"/nope?access_token={SECRET}", f"/live/?access_token={access}",
                           f"/notes/?access%5Ftoken={SECRET}"):
                assert (await get(target, bearer)).code == 404

        for target, headers in ((f"/live?access_token={access}", {}), (f"/live?x=1&access_token={access}", bearer),
                                (f"/live?access%5Ftoken={access}", {})):
            logged_as.append(masked_target(target))
            connection = await websocket_connect(HTTPRequest(ws + target, headers=headers))
            assert await asyncio.wait_for(connection.read_message(), DEADLINE) == "hello"
            connection.close()
        logged_as.append(masked_target(f"/live?access_token={SECRET}"))
        with pytest.raises(HTTPClientError):  # refused before the upgrade
            await websocket_connect(ws + f"/live?access_token={SECRET}")
        assert (await http_client.fetch(api + "/healthz")).code == 200  # the lines before it are written
    finally:
        out, err = await asyncio.get_running_loop().run_in_executor(None, end, process)
    log = out + err
    assert SECRET not in log and access not in log, log
    for target in logged_as:
        assert "access_token=***" in target and target in log, (target, log)
