"""tokensvc on the memory backend, seeded in process for the benchmark.

Builds the same application as ``tokensvc serve`` (``make_app`` over a ``MemoryStore``), then
fills the store through the protocol layer itself: a client, a user, N live access tokens,
a pool of authorization codes and of refresh tokens. The secrets the load generator needs
are written one per line to files in the output folder. Logging is configured as
``tokensvc serve`` does, with the access log at its default level (info) going to a file.

    python bench/seeded.py PORT OUTDIR --tokens N --codes N --refresh N [--switch NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from datetime import timedelta
from pathlib import Path

import tornado.httpserver

from tokensvc import config as config_module
from tokensvc import logs
from tokensvc.app import make_app
from tokensvc.bootstrap import make_context, seed
from tokensvc.oauth import hashing, pkce
from tokensvc.oauth import tokens as token_format
from tokensvc.oauth.context import OAuthContext
from tokensvc.records import AuthorizationCode, Family, Grant, Subject, User, utcnow
from tokensvc.storage.memory import MemoryStore

CLIENT_SECRET = "bench-client-secret-0123456789abcdef"
REDIRECT = "http://127.0.0.1:1/cb"
VERIFIER = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"


def new_family(ctx: OAuthContext, grant: Grant, now) -> tuple[token_format.Minted, Family]:
    """A family as a code's redemption starts it: its pair's secrets, and its record."""
    secret = token_format.family_secret(hashing.new_secret(), VERIFIER)
    minted = token_format.mint(secret, list(grant.scopes), now, ctx.tokens.access_ttl, ctx.tokens.refresh_ttl)
    pair = minted.pair
    family = Family(token_format.family_id(secret), grant.grant_id, grant.client_id, grant.user_id,
                    grant.installation_id, grant.generation, list(pair.scopes), now, pair.refresh_hash,
                    pair.access_hash, now, pair.expires_at, pair.access_expires_at, renewed_at=now)
    return minted, family


def settings(port: int) -> config_module.Settings:
    return config_module.from_dict({
        "base_url": f"http://127.0.0.1:{port}", "auth_url": f"http://127.0.0.1:{port}", "port": port,
        "cookie_secret": "bench-cookie-secret-0123456789abcdef",
        "tokens": {"access_ttl": 86400, "code_ttl": 3600},
        "clients": [{"client_id": "bench", "name": "Bench", "redirect_uris": [REDIRECT], "first_party": True,
                     "client_secret": CLIENT_SECRET, "allowed_scopes": ["read", "write"]}],
        "users": [{"username": "bench-user", "password": "amber-kettle-lantern"}],
    })


async def fill(ctx: OAuthContext, out: Path, tokens: int, codes: int, refresh: int, rounds: int = 1) -> None:
    """Each operation gets its own user (so its own grant) and its own files, and the warm-up
    its own pool of single-use values: a replay would revoke a whole grant."""
    store = ctx.store
    now = utcnow()

    async def grant_of(username: str):
        user = User(f"u_{username}", username, hashing.dummy_password_hash())
        await store.put_user(user)
        return user, await store.save_grant("bench", Subject(user_id=user.user_id), ["read", "write"], now)

    async def pairs(grant, count: int, keep: str) -> list[str]:
        secrets = []
        for _ in range(count):
            minted, family = new_family(ctx, grant, now)
            await store.create_family(family)
            if len(secrets) < 10_000 or keep == "refresh":
                secrets.append(minted.refresh_token if keep == "refresh" else minted.access_token)
        return secrets

    def write(name: str, lines: list[str]) -> None:
        (out / name).write_text("\n".join(lines) + "\n")

    _, grant = await grant_of("bench-access")
    write("access.txt", await pairs(grant, tokens, "access"))
    phases = [name for n in range(1, rounds + 1) for name in (f"warmup{n}", f"main{n}")]
    for phase in phases:
        _, grant = await grant_of(f"bench-refresh-{phase}")
        write(f"refresh-{phase}.txt", await pairs(grant, refresh, "refresh"))
        user, _ = await grant_of(f"bench-code-{phase}")
        challenge, lines = pkce.s256(VERIFIER), []
        for _ in range(codes if phase.startswith("main") else codes // 4):
            code = hashing.new_secret()
            await store.add_code(AuthorizationCode(hashing.digest(code), "bench", REDIRECT, ["read"], user.user_id,
                                                   None, challenge, "S256", now + timedelta(hours=1)))
            lines.append(code)
        write(f"codes-{phase}.txt", lines)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokens", type=int, default=10000)
    parser.add_argument("--codes", type=int, default=0)
    parser.add_argument("--refresh", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1, help="pools of single-use values for this many rounds")
    parser.add_argument("--log-level", default="info", help="info is the service's default")
    parser.add_argument("--switch", help="a switch variant of bench/inprocess.py, for the whole run (bench/wrk_ab.py)")
    args = parser.parse_args()
    if args.switch:
        from variants import VARIANTS

        VARIANTS[args.switch].switched().__enter__()
    config = dataclasses.replace(settings(args.port), log_level=args.log_level)
    # As ``tokensvc serve`` does, with the lines going to a file instead of standard error.
    logs.configure(config.log_format, config.log_level, stream=open(args.out / "access.log", "w"))  # noqa: SIM115
    store = MemoryStore()
    ctx = make_context(config, store)
    await seed(store, config)
    await fill(ctx, args.out, args.tokens, args.codes, args.refresh, args.rounds)
    server = tornado.httpserver.HTTPServer(make_app(config, store, ctx))
    server.listen(args.port, "127.0.0.1")
    (args.out / "ready").write_text("ok")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
