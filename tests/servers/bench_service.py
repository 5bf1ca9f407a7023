"""A loopback RAG service for ``make bench-systems``: every reply takes a fixed time, in three
shapes (asyncio, HTTP/1.1 keep-alive).

    python tests/servers/bench_service.py --delay-ms 50 --port 0   # prints "listening on URL"

POST /query   ragexp's own contract: {"question", "k", "case_id"} -> {"ranked_ids", ...}
POST /mapped  its own names: {"input": {"text"}, "top_k"} -> {"data": {"reply", "hits": [...]}}
POST /sse     the /mapped reply streamed as server-sent events: five pieces of answer spread over
              the delay, then one event with the hits, then [DONE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from typing import Any

PIECES = 5


def hits(k: int) -> list[dict[str, str]]:
    return [{"id": f"d{i}", "text": f"text {i}"} for i in range(k)]


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body: dict[str, Any] = json.loads(await reader.readexactly(length)) if length else {}
            if path == b"/sse":
                await stream(writer, body, delay)
                continue
            await asyncio.sleep(delay)
            if path == b"/mapped":
                k = int(body.get("top_k", 3))
                payload: Any = {"data": {"reply": f"answer to {body['input']['text']} [1]", "hits": hits(k)}}
            else:
                k = int(body.get("k", 3))
                payload = {
                    "ranked_ids": [f"d{i}" for i in range(k)],
                    "contexts": [f"text {i}" for i in range(k)],
                    "answer": f"answer to {body.get('case_id')} [1]",
                    "citations": [1],
                }
            data = json.dumps(payload).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(data)).encode()
                + b"\r\n\r\n"
                + data
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def stream(writer: asyncio.StreamWriter, body: dict[str, Any], delay: float) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    words = f"answer to {body['input']['text']} [1]".split(" ")
    # Each piece is due at a fixed time after the request, so the reply as a whole takes the
    # delay, as the other routes do: sleeping delay/PIECES five times would add five oversleeps.
    start = asyncio.get_running_loop().time()
    for index in range(PIECES):
        await asyncio.sleep(max(0.0, start + delay * (index + 1) / PIECES - asyncio.get_running_loop().time()))
        piece = " ".join(words[index::PIECES]) + " "  # any split does: only the time matters
        event = b"data: " + json.dumps({"delta": piece}).encode() + b"\n\n"
        writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
    for event in (
        b"data: " + json.dumps({"hits": hits(int(body.get("top_k", 3)))}).encode() + b"\n\n",
        b"data: [DONE]\n\n",
    ):
        writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def main(port: int, delay: float) -> None:
    server = await asyncio.start_server(lambda r, w: handle(r, w, delay), "127.0.0.1", port, backlog=512)
    print(f"listening on http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(args.port, args.delay_ms / 1000))
