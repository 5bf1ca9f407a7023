"""A stand-in RAG service with a ``generate`` endpoint, as ``provider.system.generate`` calls it:
``POST /<version>/query`` takes ``{"question", "k"}`` and answers with ragexp's contract;
``POST /<version>/generate`` takes ``{"question", "contexts"}`` and answers ``{"result": {"text",
"cites"}}``. ``version`` is ``baseline`` or ``candidate`` of :mod:`tests.pipelines.attribution`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from tests.pipelines import attribution
from tests.servers.base import Backlogged, JsonHandler


class Handler(JsonHandler):
    calls: ClassVar[dict[str, int]] = {}

    def do_POST(self) -> None:
        body: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _, version, action = self.path.split("/")
        Handler.calls[self.path] = Handler.calls.get(self.path, 0) + 1
        if action == "query":
            self.reply(200, getattr(attribution, version)(body["question"], int(body["k"])))
        elif action == "generate":
            if not isinstance(body.get("contexts"), list):
                self.reply(400, {"error": "contexts: expected a list"})
                return
            found = getattr(attribution, f"generate_{version}")(body["question"], body["contexts"])
            self.reply(200, {"result": {"text": found["answer"], "cites": found["citations"]}})
        else:
            self.reply(404, {"error": "no such endpoint"})


@contextmanager
def serving() -> Iterator[str]:
    server = Backlogged(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
