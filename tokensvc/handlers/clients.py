"""``GET /oauth/clients`` and ``GET /oauth/clients/{client_id}``: the public face of clients."""

from __future__ import annotations

from tokensvc import schemas
from tokensvc.errors import NotFound
from tokensvc.handlers.edge.json_handler import JsonHandler


class ClientListHandler(JsonHandler):
    async def get(self) -> None:
        self.send_json(schemas.oauth_clients.dump(await self.ctx.store.list_clients()))


class ClientHandler(JsonHandler):
    path_schema = schemas.client_id_path

    async def get(self, client_id: str) -> None:
        client = await self.ctx.store.get_client(client_id)
        if client is None:
            raise NotFound(f"No client with id {client_id!r}")
        self.send_json(schemas.oauth_client.dump(client))
