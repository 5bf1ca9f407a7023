"""A loopback HTTP/1.1 server that answers every POST after a fixed delay (asyncio, keep-alive).

python tests/servers/fixed_delay.py --delay-ms 50 --port 0   # prints "listening on URL"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = json.loads(await reader.readexactly(length)) if length else {}
            await asyncio.sleep(delay)
            k = int(body.get("k", 3))
            payload = json.dumps(
                {
                    "ranked_ids": [f"d{i}" for i in range(k)],
                    "contexts": [f"text {i}" for i in range(k)],
                    "answer": f"answer to {body.get('case_id')} [1]",
                    "citations": [1],
                }
            ).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(payload)).encode()
                + b"\r\n\r\n"
                + payload
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(port: int, delay: float) -> None:
    server = await asyncio.start_server(lambda r, w: handle(r, w, delay), "127.0.0.1", port, backlog=512)
    print(f"listening on http://127.0.0.1:{server.sockets[0].getsockname()[1]}/query", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(args.port, args.delay_ms / 1000))
