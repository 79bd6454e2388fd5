"""The MongoDB store's web sessions (:class:`MongoSessions`, the Store contract's
:class:`~tokensvc.storage.base.Sessions`): credentials keyed by the hash of the cookie's id,
in either format (credentials.py)."""

from __future__ import annotations

from datetime import datetime

from pymongo import DESCENDING

from tokensvc.records import Session
from tokensvc.storage.base import MAX_LISTED_SESSIONS, Sessions
from tokensvc.storage.mongo.connection import Connection
from tokensvc.storage.mongo.credentials import Credentials
from tokensvc.storage.mongo.mapping import SESSIONS, stored
from tokensvc.storage.mongo.retry import guarded
from tokensvc.storage.mongo.stamps import Stamps


class MongoSessions(Sessions):
    """The sessions collection: one document per sign-in, removed by its TTL index."""

    def __init__(self, connection: Connection, credentials: Credentials, stamps: Stamps) -> None:
        self.connection, self.credentials, self.stamps = connection, credentials, stamps
        self.sessions = credentials.collections["sessions"]

    @guarded()
    async def add_session(self, session: Session) -> None:
        await self.sessions.insert_one(SESSIONS.doc(session, await self.connection.writing()))

    @guarded()
    async def get_session(self, session_hash: str) -> Session | None:
        session = SESSIONS.record(await self.credentials.one("sessions", SESSIONS.match(session_hash=session_hash)))
        return None if session is None or session.ended_at is not None else session

    async def end_session(self, session_hash: str, now: datetime) -> bool:
        # Ended already: its mark stamped again when a write landed it late (stamps.py).
        if await self._end_session(session_hash, now):
            return True
        await self.stamps.late("sessions", SESSIONS.match(session_hash=session_hash), "ended_at", now)
        return False

    @guarded(stamps=lambda self, session_hash, now: ("sessions", SESSIONS.match(session_hash=session_hash),
                                                     "ended_at", now))
    async def _end_session(self, session_hash: str, now: datetime) -> bool:
        result = await self.credentials.write_one("sessions", session_hash, lambda: self.sessions.update_one(
            SESSIONS.writable(session_hash=session_hash, ended_at=None),
            {"$set": {"ended_at": now}}))
        return result.modified_count == 1

    @guarded()
    async def list_user_sessions(self, user_id: str, now: datetime) -> list[Session]:
        live = {"user_id": user_id, "ended_at": None, "expires_at": {"$gt": now}}
        documents = await self.credentials.listing("sessions", lambda: self.sessions.find(live).sort(
            [("last_seen_at", DESCENDING), ("_id", DESCENDING)]).limit(MAX_LISTED_SESSIONS).to_list(None))
        return [session for session in map(SESSIONS.record, documents) if session.ended_at is None]

    @guarded()
    async def touch_session(self, session_hash: str, now: datetime) -> None:
        await self.credentials.write_one("sessions", session_hash, lambda: self.sessions.update_one(
            SESSIONS.writable(session_hash=session_hash), {"$set": {"last_seen_at": now}}))

    @guarded(stamps=lambda self, user_id, now: ("sessions", {"user_id": user_id}, "ended_at", stored(now)))
    async def end_user_sessions(self, user_id: str, now: datetime) -> int:
        now = stored(now)
        result = await self.sessions.update_many({"user_id": user_id, "ended_at": None}, {"$set": {"ended_at": now}})
        return await self.credentials.swept(result, "sessions", {"user_id": user_id, "ended_at": now})

