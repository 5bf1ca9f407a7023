"""A RAG service whose ``timings`` carry stage names MLflow refuses as metric keys.

    python tests/servers/stages.py --port 0        # prints "listening on URL"

Every answer is correct for the case (retrieves rel-<n>, states "fact <n>") and reports the
stages of :data:`STAGES`, plus one named by the request's bearer token (a service that echoes
its credential). Cases whose id starts with ``dropall-`` get the connection closed without a
reply, so a run can be made to stop with a checkpoint.
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STAGES = {
    "model": 0.02,
    "model=gpt-4 (v2)": 0.03,
    "s" * 300: 0.004,
    "检索 阶段": 0.005,
    "": 0.001,
    "a/../b": 0.002,
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        case_id = str(body.get("case_id"))
        if case_id.startswith("dropall-"):
            self.close_connection = True
            self.connection.close()
            return
        number = case_id.split("-", 1)[-1]
        token = str(self.headers.get("Authorization", "")).removeprefix("Bearer ")
        payload: dict[str, Any] = {
            "ranked_ids": [f"rel-{number}", f"noise-{number}"],
            "contexts": [f"fact {number}.", "noise"],
            "answer": f"fact {number}. [1]",
            "citations": [1],
            "timings": {**STAGES, f"auth {token}": 0.001},
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/query", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
