"""Issue 9 §5 (NET): every spelling of this machine is one target; class keywords and CIDR
rules; the fetch tool connects to the address it decided on, checked at the moment of use."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import handrail as hr
from handrail.builtin import workspace_tools
from handrail.policy import Effect, Policy

N = hr.Act.NET

LOOPBACK_SPELLINGS = [
    "0.0.0.0:8080", "0:8080", "[::]:8080", "[::1]:8080", "[::ffff:127.0.0.1]:8080",
    "2130706433:8080", "0x7f.1:8080", "017700000001:8080", "127.0.0.2:8080", "127.1:8080",
    "localhost:8080", "LOCALHOST.:8080", "api.localhost:8080", "0.0.0.0", "::",
]


def effect(policy: Policy, target: str, ws: Path) -> Effect:
    return policy.check(hr.Action(N, target), workspace=ws).effect


@pytest.mark.parametrize("rule", ["127.0.0.1", "localhost", "::1", "loopback", "0.0.0.0",
                                  "127.0.0.0/8", "::1/128", "private"])
@pytest.mark.parametrize("target", LOOPBACK_SPELLINGS)
def test_every_spelling_of_this_machine_is_one_target(tmp_path: Path, rule: str,
                                                      target: str) -> None:
    policy = Policy.permissive().layer("x").deny(N, rule)
    assert effect(policy, target, tmp_path) is Effect.DENY


def test_a_port_pinned_loopback_rule_holds_for_every_spelling(tmp_path: Path) -> None:
    policy = Policy.permissive().layer("x").deny(N, "localhost:8080")
    assert effect(policy, "0:8080", tmp_path) is Effect.DENY
    assert effect(policy, "[::1]:8080", tmp_path) is Effect.DENY
    assert effect(policy, "0:8081", tmp_path) is Effect.ALLOW


@pytest.mark.parametrize(("rule", "denied", "allowed"), [
    ("link-local", ["169.254.169.254:80", "0xa9fea9fe:80", "[fe80::1]:80"],
     ["10.0.0.1:80", "example.com:443", "127.0.0.1:80"]),
    ("private", ["10.0.0.1:80", "192.168.1.1", "[fd00::1]:80", "169.254.1.1", "0:1"],
     ["8.8.8.8:53", "example.com:443"]),
    ("10.0.0.0/8", ["10.1.2.3:80", "167772161:80", "[::ffff:10.0.0.1]:80"],
     ["11.0.0.1:80", "example.com:443", "127.0.0.1:80"]),
    ("192.168.0.0/16", ["192.168.7.7"], ["192.169.0.1"]),
])
def test_class_keywords_and_cidr_rules(tmp_path: Path, rule: str, denied: list[str],
                                       allowed: list[str]) -> None:
    policy = Policy.permissive().layer("x").deny(N, rule)
    for target in denied:
        assert effect(policy, target, tmp_path) is Effect.DENY, target
    for target in allowed:
        assert effect(policy, target, tmp_path) is Effect.ALLOW, target


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "10.0.0.0/8/1", "example.com/8", "loopback:99999"])
def test_malformed_cidr_and_keyword_rules_are_refused(bad: str) -> None:
    with pytest.raises(hr.PolicyError):
        hr.Rule(N, bad, Effect.DENY)


def test_a_keyword_is_never_a_host_name(tmp_path: Path) -> None:
    v = Policy.permissive().check(hr.Action(N, "loopback:80"), workspace=tmp_path)
    assert (v.effect, v.layer) == (Effect.DENY, "confinement")


# -- the fetch tool ----------------------------------------------------------------------------

class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"host={self.headers.get('Host')}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


async def _fetch(tmp_path: Path, url: str, policy: Policy) -> hr.ToolResult:
    def permits(action: hr.Action) -> bool:
        return policy.check(action, workspace=tmp_path).effect is Effect.ALLOW

    handler = hr.Toolbox(workspace_tools()).handler("workspace/fetch", workspace=tmp_path,
                                                    permits=permits)
    out = await handler.step(hr.Invoke("call-1", {"url": url}))
    assert isinstance(out, hr.Finished)
    return out.result


@pytest.fixture
def resolves_to_loopback(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`public.example` resolves to 127.0.0.1 (a DNS answer an attacker controls)."""
    import anyio

    asked: list[str] = []
    real = anyio.getaddrinfo

    async def fake(host: Any, port: Any, **kw: Any) -> Any:
        asked.append(str(host))
        if host == "public.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return await real(host, port, **kw)

    monkeypatch.setattr("handrail.builtin._fetch.anyio.getaddrinfo", fake)
    return asked


@pytest.mark.anyio
async def test_a_name_resolving_into_a_denied_class_is_not_fetched(
    tmp_path: Path, port: int, resolves_to_loopback: list[str]
) -> None:
    policy = Policy.permissive().layer("x").deny(N, "loopback")
    result = await _fetch(tmp_path, f"http://public.example:{port}/", policy)
    assert result.is_error
    assert "resolves to 127.0.0.1 (loopback" in result.render_text()
    assert resolves_to_loopback == ["public.example"]


@pytest.mark.anyio
async def test_the_fetch_connects_to_the_decided_address_and_keeps_the_name(
    tmp_path: Path, port: int, resolves_to_loopback: list[str]
) -> None:
    policy = Policy.permissive()
    result = await _fetch(tmp_path, f"http://public.example:{port}/x", policy)
    assert not result.is_error, result.render_text()
    assert f"host=public.example:{port}" in result.render_text()
    assert resolves_to_loopback == ["public.example"]  # resolved once, never again


@pytest.mark.anyio
@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "127.1", "[::ffff:127.0.0.1]"])
async def test_an_address_spelling_is_fetched_at_the_address_it_means(
    tmp_path: Path, port: int, host: str
) -> None:
    result = await _fetch(tmp_path, f"http://{host}:{port}/", Policy.permissive())
    assert not result.is_error, result.render_text()
    assert f"host={host}:{port}" in result.render_text()
