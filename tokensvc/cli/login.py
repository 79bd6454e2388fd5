"""How the command line gets an admin's access token for the admin API, the way native apps do
(RFC 8252): ``tokensvc login`` runs the authorization-code flow with PKCE as the first-party
public client ``tokensvc-cli``, through a redirect to a loopback port of its own, and keeps the
refresh token in the user's configuration directory (mode 0600); every later command refreshes
it there (rotation: the new one replaces it at once). The operator signs in, and the page that
names the command line and its port shows a confirmation code, which they type on the terminal
before choosing Continue (not echoed, as a password; ``--confirmation-stdin`` reads it from
standard input instead): any program may listen on a loopback port and any page may start
the request, so only the exchange that carries the code the page showed gets the token
(``oauth/confirmation.py``). What is typed is asked again while it cannot be a code, and, once
the service says it is not the page's, up to the code's three presentations.

Automation follows the spec's recipe instead (a service account, docs/guide/administration.md): a
first-party client of its own, confidential, and a user; one ``tokensvc login
--token-client-id ID --callback-port PORT --refresh-token FILE`` (``TOKENSVC_ADMIN_CLIENT_SECRET``
in the environment; PORT the one of the client's loopback redirect URI) signs in as that user
once and keeps the refresh token in FILE; every later command runs with the same
``--refresh-token FILE --token-client-id ID`` (or ``TOKENSVC_ADMIN_CLIENT_ID``), and FILE is
rewritten with each rotation. An access token alone (``--token``, ``TOKENSVC_ADMIN_TOKEN``) also
serves, until it expires.

A refresh token rotates, and the one rotated out is spent (presented again, it revokes its
chain); a refresh also replaces the chain's access token (one pair per chain). So every command
holds an advisory lock on the file (``<file>.lock``) from reading the token, through writing its
successor, to its last call with the new access token: parallel commands take turns, each
refreshing from the token the one before kept, and none ends another's access token while it
is in use. The file is written whole into a new ``.partial`` file (created exclusively, never
through a link, mode 0600 whatever the umask) that then replaces it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import select
import sys
import termios
import threading
import webbrowser
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from tokensvc.admin.operator import unreachable
from tokensvc.oauth import confirmation

ADMIN_URL_ENV = "TOKENSVC_ADMIN_URL"
TOKEN_ENV = "TOKENSVC_ADMIN_TOKEN"
CLIENT_ID_ENV = "TOKENSVC_ADMIN_CLIENT_ID"
CLIENT_SECRET_ENV = "TOKENSVC_ADMIN_CLIENT_SECRET"
CREDENTIALS_ENV = "TOKENSVC_CREDENTIALS"  # where `tokensvc login` keeps its refresh tokens
LOGIN_TIMEOUT_SECONDS = 300


class LoginError(Exception):
    """What went wrong getting a token: one line for the operator."""


class Refused(LoginError):
    """The service answered with an error (RFC 6749 §5.2 at the token endpoint): its ``error``
    and ``error_description`` beside the line."""

    def __init__(self, line: str, error: str | None, description: str | None) -> None:
        super().__init__(line)
        self.error, self.description = error, description


def admin_url(args: argparse.Namespace) -> str | None:
    return getattr(args, "url", None) or os.environ.get(ADMIN_URL_ENV) or None


def credentials_path() -> Path:
    if os.environ.get(CREDENTIALS_ENV):
        return Path(os.environ[CREDENTIALS_ENV])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "tokensvc" / "credentials.json"


def read_private(path: Path) -> str | None:
    """The text of ``path`` (None: no such file), never read through a link."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LoginError(f"{path}: {exc.strerror or exc} (a link is never followed)") from None
    with os.fdopen(descriptor) as file:
        return file.read()


def _load(path: Path) -> dict[str, Any]:
    return json.loads(read_private(path) or "{}")


def _save(path: Path, data: dict[str, Any]) -> None:
    write_private(path, json.dumps(data, indent=2) + "\n")


def write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by its owner alone (0600, a new directory 0700), replacing the
    file in one step: a refresh token is never half-written, nor readable by others meanwhile.
    The new text goes into a file made for it (``O_EXCL``: whatever was at ``.partial`` before,
    a leftover or a planted link, is removed, never written through) with mode 0600 whatever
    the umask; then it takes ``path``'s place (a link there is replaced, not followed)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(partial)
    try:
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise LoginError(f"{partial}: {exc.strerror or exc}") from None
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


@contextlib.asynccontextmanager
async def held(path: Path) -> AsyncIterator[None]:
    """An advisory lock on ``path`` (``flock`` on ``<path>.lock``, 0600, beside it), held from
    reading a refresh token to writing its successor: parallel commands take turns."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        descriptor = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise LoginError(f"{path}.lock: {exc.strerror or exc}") from None
    try:
        await asyncio.to_thread(fcntl.flock, descriptor, fcntl.LOCK_EX)  # waits for the command before
        yield
    finally:
        os.close(descriptor)  # and with it the lock


async def _fetch(url: str, method: str = "GET", form: dict[str, str] | None = None,
                 unanswered: Callable[[object], str] | None = None) -> Any:
    """The JSON answer of ``url``; ``unanswered(reason)``: the line when nothing answers (by
    default, the token endpoint's)."""
    from tornado.httpclient import AsyncHTTPClient, HTTPClientError

    unanswered = unanswered or (lambda reason: token_endpoint_unreachable(url, reason))
    try:
        response = await AsyncHTTPClient().fetch(url, method=method, raise_error=False,
                                                 body=urlencode(form) if form is not None else None)
    except (OSError, HTTPClientError) as exc:  # HTTPTimeoutError: a listener that accepts and never answers
        raise LoginError(unanswered(exc)) from None
    if response.code == 599:
        raise LoginError(unanswered(response.error))
    try:
        answer = json.loads(response.body or b"{}")
    except ValueError:
        raise LoginError(f"{url} answered {response.code}, not JSON: is it the admin listener?") from None
    if response.code >= 400:
        reason = answer.get("error_description") or answer.get("error") or answer.get("detail") or response.code
        raise Refused(f"{url} refused: {reason}", answer.get("error"), answer.get("error_description"))
    return answer


def token_endpoint_unreachable(url: str, reason: object) -> str:
    """Why the token endpoint at ``url`` was not reached, and what to check: it is the service's
    public URL (``base_url``, which the admin listener's index names), not the admin listener."""
    why = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
    return (f"the token endpoint at {url} does not answer ({why}): it is the service's public URL (base_url); check "
            "that this machine reaches it")


async def discover(url: str) -> dict[str, Any]:
    """The admin listener's index: the service's token endpoints and the CLI's client."""
    return await _fetch(url.rstrip("/") + "/admin", unanswered=lambda reason: unreachable(url.rstrip("/"), reason))


def _refresh_endpoint(token_endpoint: str) -> str:
    return token_endpoint.rstrip("/") + "/refresh"  # the spec keeps refresh at /oauth/token/refresh


@contextlib.asynccontextmanager
async def access_token(args: argparse.Namespace, url: str) -> AsyncIterator[str]:
    """An access token for the admin API at ``url``, for the calls made within: given, or
    refreshed from a refresh token (``--refresh-token FILE``, or what ``tokensvc login`` kept),
    whose file stays locked until the calls are done."""
    given = getattr(args, "token", None) or os.environ.get(TOKEN_ENV)
    if given:
        yield given
        return
    index = await discover(url)
    refresh_at = _refresh_endpoint(index["tokenEndpoint"])
    if getattr(args, "refresh_token", None):
        path = Path(args.refresh_token)
        client_id = getattr(args, "token_client_id", None) or os.environ.get(CLIENT_ID_ENV)
        if not client_id:
            raise LoginError(f"--refresh-token needs its client: --token-client-id or {CLIENT_ID_ENV}")
        async with held(path):
            refresh_token = (read_private(path) or "").strip()
            if not refresh_token:
                raise LoginError(f"{path}: no refresh token there")
            form = {"refresh_token": refresh_token, "client_id": client_id, **_secret()}
            try:
                tokens = await _fetch(refresh_at, "POST", form)
            except Refused as refused:  # not a token endpoint that does not answer: its own line says so
                raise LoginError(f"{refused}; the refresh token in {path} no longer works for {client_id}: sign "
                                 f"in again with `tokensvc login --url {url} --token-client-id {client_id} "
                                 f"--callback-port PORT --refresh-token {path}`") from None
            write_private(path, tokens["refresh_token"] + "\n")  # rotated: the old one is spent
            yield tokens["access_token"]
        return
    path = credentials_path()
    async with held(path):
        everything = _load(path)
        stored = everything.get(url.rstrip("/"))
        if not stored:
            raise LoginError(f"not signed in to {url}: run `tokensvc login --url {url}` (or give --token)")
        try:
            tokens = await _fetch(refresh_at, "POST", {"refresh_token": stored["refresh_token"],
                                                      "client_id": stored["client_id"]})
        except Refused as refused:  # ended, revoked, or spent elsewhere: only a new sign-in helps
            raise LoginError(f"{refused}; the sign-in kept in {path} for {url} no longer works: run "
                             f"`tokensvc login --url {url}` again") from None
        everything[url.rstrip("/")] = {**stored, "refresh_token": tokens["refresh_token"]}
        _save(path, everything)
        yield tokens["access_token"]


def _secret() -> dict[str, str]:
    """The client secret of a confidential client, from the environment (never a flag)."""
    return {"client_secret": os.environ[CLIENT_SECRET_ENV]} if os.environ.get(CLIENT_SECRET_ENV) else {}


def callback_page(title: str, text: str) -> bytes:
    """The page the browser lands on at the command line's loopback port: the service's look
    (its stylesheet's colours and card), inline, since nothing else is served there."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · tokensvc</title>
<style>
body {{ margin: 0; display: flex; justify-content: center; padding: 6vh 16px; background: #f3f5f9; color: #1c2330;
       font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }}
main {{ width: 100%; max-width: 440px; background: #fff; border: 1px solid #dde2ec; border-radius: 12px;
       padding: 28px; box-shadow: 0 4px 24px rgba(20, 30, 60, .06); }}
header {{ font-weight: 600; color: #5b6475; margin-bottom: 12px; }} h1 {{ font-size: 1.45rem; margin: .2em 0 .4em; }}
p {{ margin: 0; color: #5b6475; }}
</style></head>
<body><main><header>tokensvc command line</header><h1>{title}</h1><p>{text}</p></main></body></html>
""".encode()


def _pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


# -- the confirmation code ----------------------------------------------------------------------

# Reads what the person types after a prompt, or None once there is nothing more to read (the
# end of the input, or the event set: the sign-in ended otherwise).
Reader = Callable[[str, threading.Event], "str | None"]
FIRST_PROMPT = "Confirmation code: "
NOT_A_CODE = "That is not a confirmation code (8 letters and digits, as the page shows them). Type it again: "


def typed_on_the_terminal(prompt: str, stop: threading.Event) -> str | None:
    """What the person types on the terminal after ``prompt``, not echoed (as getpass reads a
    password, from the terminal itself whatever standard input is), or None once ``stop`` is
    set or the input ends. The terminal is left as it was found, however the reading ends."""
    try:
        descriptor = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        raise LoginError("no terminal to type the confirmation code on: give it on standard input with "
                         "--confirmation-stdin") from None
    try:
        before = termios.tcgetattr(descriptor)
        quiet = termios.tcgetattr(descriptor)
        quiet[3] &= ~termios.ECHO
        termios.tcsetattr(descriptor, termios.TCSAFLUSH, quiet)
        line = b""
        try:
            os.write(descriptor, prompt.encode())
            while b"\n" not in line:
                if stop.is_set():
                    return None
                ready, _, _ = select.select([descriptor], [], [], 0.1)
                if ready:
                    chunk = os.read(descriptor, 1024)
                    if not chunk:
                        return None
                    line += chunk
        finally:
            termios.tcsetattr(descriptor, termios.TCSAFLUSH, before)
            os.write(descriptor, b"\n")
        return line.partition(b"\n")[0].decode("utf-8", "replace")
    finally:
        os.close(descriptor)


def typed_on_stdin(prompt: str, stop: threading.Event) -> str | None:
    """A line of standard input (``--confirmation-stdin``), the prompt on standard error."""
    print(prompt.rstrip(), file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    return line.rstrip("\r\n") if line else None


def ask(read: Reader, stop: threading.Event, prompt: str = FIRST_PROMPT) -> str | None:
    """The confirmation code the person types, as issued (``confirmation.normalized``); "" when
    they type nothing (a page of a service that shows none); asked again while what is typed
    cannot be a code; None when the input ends."""
    while True:
        typed = read(prompt, stop)
        if typed is None:
            return None
        if not typed.strip():
            return ""
        code = confirmation.normalized(typed)
        if code is not None:
            return code
        prompt = NOT_A_CODE


def asked_in_a_thread(read: Reader, stop: threading.Event,
                      prompt: str = FIRST_PROMPT) -> tuple[asyncio.Future[str | None], threading.Thread]:
    """:func:`ask` in a thread of its own (a daemon: a read of standard input cannot be
    interrupted, and must not keep the command from ending), its answer a future of this loop."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str | None] = loop.create_future()

    def settle(result: str | None, error: BaseException | None) -> None:
        if answer.done():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result)

    def run() -> None:
        try:
            result, error = ask(read, stop, prompt), None
        except Exception as exc:  # handed to the loop, which says it in one line
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop has ended: nobody waits for the answer any more
            loop.call_soon_threadsafe(settle, result, error)

    thread = threading.Thread(target=run, name="confirmation-code", daemon=True)
    thread.start()
    return answer, thread


async def login(url: str, open_browser: bool = True, timeout: float = LOGIN_TIMEOUT_SECONDS, *,
                client_id: str | None = None, keep_in: Path | None = None, port: int = 0,
                read: Reader = typed_on_the_terminal) -> dict[str, Any]:
    """Sign in to the service behind the admin listener at ``url`` as an admin, in a browser,
    as the CLI's client or as ``client_id`` (a service account's: its secret from
    ``TOKENSVC_ADMIN_CLIENT_SECRET``); keep the refresh token in the credentials file, or in
    ``keep_in`` alone. The redirect comes back to ``http://127.0.0.1:PORT/callback``: any free
    port for a public client (its loopback redirect matches any port, RFC 8252 §7.3), ``port``
    for a confidential one, whose registered redirect URI matches exactly. A public client's
    exchange carries the confirmation code its page showed, as ``read`` gets it from the person
    (the terminal, or standard input), asked while the browser is on the page. Returns the
    tokens."""
    index = await discover(url)
    client_id = client_id or index.get("cliClientId")
    if not client_id:
        raise LoginError("this service does not offer `tokensvc login` as its own client (admin.cli_client = "
                         "false): give a client of yours (--token-client-id), or --token")
    verifier, challenge = _pkce()
    state = secrets.token_urlsafe(16)
    received: asyncio.Future[dict[str, list[str]]] = asyncio.get_running_loop().create_future()
    # A confidential client's code is worth nothing without its secret: its page shows no code.
    confirming = not _secret()
    stop = threading.Event()
    typed: asyncio.Future[str | None] | None = None
    asking: threading.Thread | None = None

    async def callback(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_line = (await reader.readline()).decode("latin-1")
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        query = parse_qs(urlsplit(request_line.split(" ")[1] if " " in request_line else "").query)
        if "code" not in query:
            page = callback_page("Not signed in", "The command line says why.")
        elif typed is not None and not typed.done():
            page = callback_page("Type the code in the command line",
                                 "Type the confirmation code the sign-in page showed where the command line asks "
                                 "for it: that finishes the sign-in.")
        else:
            page = callback_page("Signed in", "You can close this window and go back to the command line.")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nConnection: close\r\n"
                     b"Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'\r\n"
                     b"Referrer-Policy: no-referrer\r\nCache-Control: no-store\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(page), page))
        await writer.drain()
        writer.close()
        if query.get("state") == [state] and not received.done():
            received.set_result(query)

    try:
        server = await asyncio.start_server(callback, "127.0.0.1", port)
    except OSError as exc:
        raise LoginError(f"cannot listen on 127.0.0.1:{port} for the sign-in's redirect ({exc.strerror})") from None
    redirect_uri = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/callback"
    authorize = index["authorizationEndpoint"] + "?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "scope": "admin",
        "state": state, "code_challenge": challenge, "code_challenge_method": "S256"})
    print(f"Sign in as an administrator in your browser:\n  {authorize}", file=sys.stderr, flush=True)
    try:
        if confirming:
            print("The page shows a confirmation code: type it here (it is not shown as you type), then choose "
                  "Continue on the page.", file=sys.stderr, flush=True)
            typed, asking = asked_in_a_thread(read, stop)
        if open_browser:
            # In a thread of its own: a browser command may not return until the browser closes,
            # and the redirect must be served meanwhile.
            threading.Thread(target=webbrowser.open, args=(authorize,), daemon=True).start()
        try:
            # The redirect, or the code typed first: a question that cannot be asked (no terminal),
            # or input that ended, is said at once, not after the sign-in.
            deadline = asyncio.get_running_loop().time() + timeout
            waited: list[asyncio.Future[Any]] = [received] if typed is None else [received, typed]
            await asyncio.wait(waited, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if typed is not None and typed.done() and typed.result() is None:  # result() raises what it met
                raise LoginError("no confirmation code was typed")
            query = await asyncio.wait_for(received, max(0.0, deadline - asyncio.get_running_loop().time()))
        except TimeoutError:
            raise LoginError(f"no sign-in within {int(timeout)} s") from None
        finally:
            server.close()
        if "error" in query:
            raise LoginError(f"the service refused: {query.get('error_description', query['error'])[0]}")
        code = None
        if typed is not None:
            try:
                code = await asyncio.wait_for(typed, timeout)
            except TimeoutError:
                raise LoginError(f"no confirmation code typed within {int(timeout)} s") from None
            if code is None:
                raise LoginError("no confirmation code was typed")
        form = {"grant_type": "authorization_code", "code": query["code"][0], "redirect_uri": redirect_uri,
                "code_verifier": verifier, "client_id": client_id, **_secret()}
        tokens = await _exchange(index["tokenEndpoint"], form, code, read, stop)
    finally:
        stop.set()  # a question still on the terminal ends, and leaves it as it was
        if asking is not None:
            asking.join(0.5)
    if keep_in is not None:
        async with held(keep_in):
            write_private(keep_in, tokens["refresh_token"] + "\n")
        return tokens
    path = credentials_path()
    async with held(path):
        everything = _load(path)
        everything[url.rstrip("/")] = {"client_id": client_id, "refresh_token": tokens["refresh_token"]}
        _save(path, everything)
    return tokens


async def _exchange(endpoint: str, form: dict[str, str], code: str | None, read: Reader,
                    stop: threading.Event) -> dict[str, Any]:
    """The code's exchange, with the confirmation ``code`` typed (none: "" or None); while the
    service says it is not the page's, the person types it again, as often as the code may be
    presented with one."""
    for left in range(confirmation.PRESENTATIONS - 1, -1, -1):
        try:
            return await _fetch(endpoint, "POST", {**form, **({confirmation.PARAMETER: code} if code else {})})
        except Refused as refused:
            if not code or not left or refused.description != confirmation.NOT_THE_PAGES:
                raise
        answer, _ = asked_in_a_thread(read, stop, f"That is not the code the page showed. Type it again "
                                                  f"({left} {'tries' if left > 1 else 'try'} left): ")
        code = await answer
        if not code:
            raise LoginError("no confirmation code was typed")
    raise AssertionError("unreachable: the last try raises")  # pragma: no cover
