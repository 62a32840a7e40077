"""A real webhook receiver on 127.0.0.1 that verifies every delivery's signature.

Not a mock: an HTTP server (the standard library's, in a thread) that reads each POST, checks
it with `hr.approval.WebhookVerifier` (signature, age, delivery id seen before) and answers
200 when it holds, 401 when it does not. `status` makes it answer something else (a 503 from
a receiver that is up but failing).
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from typing import Any

from handrail.approval import WebhookVerifier
from handrail.errors import SignatureInvalid


class Receiver:
    """Start with `start()` (on `port`, 0 for any free one), stop with `stop()`."""

    def __init__(self, secret: str, *, port: int = 0, status: int = 200) -> None:
        self.verifier = WebhookVerifier(secret)
        self.port = port
        self.status = status
        self.deliveries: list[dict[str, Any]] = []
        """What arrived and verified, parsed."""
        self.raw: list[tuple[bytes, dict[str, str]]] = []
        """Every POST's body and headers, verified or not (a test replays one)."""
        self.refused: list[str] = []
        """Why each refused delivery was refused."""
        self.arrived = threading.Event()
        """Set when a delivery verified (a test in another thread waits on it)."""
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, 1 << 20))
                headers = dict(self.headers.items())
                receiver.raw.append((body, headers))
                if receiver.status != 200:
                    self._answer(receiver.status)
                    return
                try:
                    data = receiver.verifier.verify(body, headers)
                except SignatureInvalid as exc:
                    receiver.refused.append(str(exc))
                    self._answer(401)
                    return
                receiver.deliveries.append(data)
                self._answer(200)
                receiver.arrived.set()

            def _answer(self, status: int) -> None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(10)
            self._server = None

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    """A port nothing listens on (a receiver that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST `body` as it was captured (a replay); the status the receiver answered."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, method="POST", headers={
        k: v for k, v in headers.items() if k.lower() not in ("content-length", "host")})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def loads(body: bytes) -> Any:
    return json.loads(body)
