"""The ceiling: Tornado's "Hello, world" in one process, as in tornado's own demo."""

import asyncio
import sys

import tornado.web


class MainHandler(tornado.web.RequestHandler):
    def get(self) -> None:
        self.write("Hello, world")


async def main(port: int) -> None:
    app = tornado.web.Application([(r"/", MainHandler)])
    app.listen(port, "127.0.0.1")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
