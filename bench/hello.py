"""The ceiling: Tornado's "Hello, world" in one process, as in tornado's own demo.

``POST /floor`` is a reference point, not a ceiling: the least any form-posting JSON endpoint
does in Tornado (parse the form, set the no-store headers, write a small JSON body).
"""

import asyncio
import json
import sys

import tornado.web


class MainHandler(tornado.web.RequestHandler):
    def get(self) -> None:
        self.write("Hello, world")


class FloorHandler(tornado.web.RequestHandler):
    def post(self) -> None:
        self.get_body_argument("token")
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.set_header("Pragma", "no-cache")
        self.finish(json.dumps({"active": False}))


async def main(port: int) -> None:
    app = tornado.web.Application([(r"/", MainHandler), (r"/floor", FloorHandler)])
    app.listen(port, "127.0.0.1")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
