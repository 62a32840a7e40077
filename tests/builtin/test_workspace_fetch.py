import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import handrail as hr
from handrail.builtin._fetch import FETCH_LIMIT_BYTES

pytestmark = pytest.mark.anyio

ROUTES: dict[str, tuple[int, dict[str, str], bytes]] = {
    "/hello": (200, {"Content-Type": "text/plain; charset=utf-8"}, "héllo".encode()),
    "/json": (200, {"Content-Type": "application/json"}, b'{"a": 1}'),
    "/latin": (200, {"Content-Type": "text/plain; charset=latin-1"}, "café".encode("latin-1")),
    "/redirect": (302, {"Location": "http://elsewhere.invalid/x"}, b""),
    "/relative": (301, {"Location": "/hello"}, b""),
    "/big": (200, {"Content-Type": "text/plain"}, b"y" * (FETCH_LIMIT_BYTES + 10_000)),
    "/png": (200, {"Content-Type": "image/png"}, b"\x89PNG\r\n\x1a\n" + b"\x00" * 100),
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, headers, body = ROUTES.get(self.path, (404, {"Content-Type": "text/plain"},
                                                       b"no such page"))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


async def test_fetch_returns_status_and_text(call, server: str) -> None:
    result = await call("fetch", url=f"{server}/hello")
    assert not result.is_error
    text = result.render_text()
    assert text.startswith("HTTP 200 OK\ncontent-type: text/plain; charset=utf-8\n\n")
    assert text.endswith("héllo")
    assert result.structured["status"] == 200


async def test_fetch_decodes_the_declared_charset(call, server: str) -> None:
    assert (await call("fetch", url=f"{server}/latin")).render_text().endswith("café")
    assert (await call("fetch", url=f"{server}/json")).render_text().endswith('{"a": 1}')


async def test_fetch_does_not_follow_redirects(call, server: str) -> None:
    result = await call("fetch", url=f"{server}/redirect")
    assert not result.is_error
    assert result.structured["location"] == "http://elsewhere.invalid/x"
    assert "not followed" in result.render_text()
    relative = await call("fetch", url=f"{server}/relative")
    assert relative.structured["location"] == f"{server}/hello"
    assert "héllo" not in relative.render_text()


async def test_fetch_bounds_the_body(call, server: str) -> None:
    result = await call("fetch", url=f"{server}/big")
    body = result.render_text().split("\n\n", 1)[1]
    shown, note = body.rsplit("\n", 1)
    assert shown == "y" * FETCH_LIMIT_BYTES
    assert note.startswith("[truncated")
    assert result.structured["truncated"] is True


async def test_fetch_describes_binary_bodies(call, server: str) -> None:
    text = (await call("fetch", url=f"{server}/png")).render_text()
    assert "[binary body: image/png, 108 bytes, not shown]" in text
    assert "PNG" not in text


async def test_fetch_http_error_status_is_an_error_result(call, server: str) -> None:
    result = await call("fetch", url=f"{server}/missing")
    assert result.is_error
    assert result.render_text().startswith("HTTP 404")


async def test_fetch_connection_refused(call) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = await call("fetch", url=f"http://127.0.0.1:{port}/")
    assert result.is_error
    assert f"127.0.0.1:{port}" in result.render_text()


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "ftp://example.com/x", "example.com/page", "/relative", "http://",
     "https://user:pw@example.com/", "javascript:alert(1)"],
)
async def test_fetch_refuses_non_http_urls(box, workspace: Path, url: str) -> None:
    handler = box.handler("workspace/fetch", workspace=workspace)
    with pytest.raises(hr.InvalidArguments) as caught:
        await handler.step(hr.Invoke("c", {"url": url}))
    assert caught.value.issues[0].path == "$.url"
