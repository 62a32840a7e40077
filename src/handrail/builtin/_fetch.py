"""The `fetch` tool: one HTTP GET, declared as `NET host:port`.

Redirects are not followed: the policy allowed one host, and a redirect may point at any
other, so the model is told where it leads and may fetch that URL (a new call, a new check).
httpx is imported on first use, not when handrail is imported.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from typing import TYPE_CHECKING, Any, cast

import anyio
from pydantic import field_validator

from handrail.policy import UncanonicalTarget, address_classes, canonical_net
from handrail.tools import Act, Action, CallContext, Text, Tool, ToolResult

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    import httpx

__all__ = ["FETCH_LIMIT_BYTES", "FETCH_TIMEOUT", "Fetch"]

FETCH_LIMIT_BYTES = 256 * 1024
"""At most this many bytes of a response body are read."""
FETCH_TIMEOUT = 30.0
"""Seconds the whole request (connect, headers, body) may take."""

_DEFAULT_PORTS = {"http": 80, "https": 443}
_TEXT_TYPES = frozenset({
    "application/json", "application/xml", "application/javascript", "application/ecmascript",
    "application/x-www-form-urlencoded", "application/x-yaml", "application/yaml",
    "application/toml", "application/x-ndjson", "image/svg+xml",
})


def _parse(url: str) -> httpx.URL:
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"not a valid URL: {exc}") from None
    if parsed.scheme not in _DEFAULT_PORTS:
        raise ValueError(
            f"only http and https URLs can be fetched, not {parsed.scheme or 'a relative'!r} "
            "URLs; give an absolute URL such as https://example.com/page"
        )
    if not parsed.raw_host:
        raise ValueError("the URL has no host; give an absolute URL such as "
                         "https://example.com/page")
    if parsed.userinfo:
        raise ValueError("the URL carries credentials (user:password@); remove them")
    return parsed


def net_target(url: httpx.URL) -> str:
    """The `host:port` an HTTP client connects to for `url` (IPv6 hosts in brackets)."""
    host = url.raw_host.decode("ascii").lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{url.port or _DEFAULT_PORTS[url.scheme]}"


class Fetch(Tool, server="workspace", name="fetch", mutates=False, protected=["/url"]):
    """Fetch a URL with an HTTP GET and return its status and text body.

    At most 256 KiB of the body is returned; binary bodies are described, not shown. Redirects
    are not followed: the result says where one leads, and you may fetch that URL.
    """

    url: str
    """An absolute http:// or https:// URL."""

    @field_validator("url")
    @classmethod
    def _http_only(cls, value: str) -> str:
        _parse(value)
        return value

    def actions(self) -> list[Action]:
        """Reaches the URL's host and port."""
        return [Action(Act.NET, net_target(_parse(self.url)))]

    async def run(self, ctx: CallContext) -> ToolResult:
        """Fetch the URL."""
        import httpx

        url = _parse(self.url)
        try:
            with anyio.fail_after(FETCH_TIMEOUT):
                address = await _decide_address(url, ctx)
                if isinstance(address, ToolResult):
                    return address
                return await _get(url, address)
        except TimeoutError:
            return ToolResult.error(f"fetching {url} took longer than {FETCH_TIMEOUT:g}s; "
                                    "gave up")
        except httpx.HTTPError as exc:
            return ToolResult.error(describe_http_error(exc, url))


async def _decide_address(url: httpx.URL, ctx: CallContext) -> str | ToolResult:
    """The one IP address this fetch will connect to, checked at the moment of use.

    An IP literal (in any spelling the policy accepts: `0`, `2130706433`, `[::ffff:...]`) is
    the address the policy decided on. A name is resolved here, off the event loop and within
    the call's deadline, and the first address is used for the connection (never re-resolved,
    so a second DNS answer cannot differ). The policy decided on the name; an address it would
    not name (this machine, link-local, private networks) is reached only when the policy
    allows that address outright, so a deny of `loopback` or `10.0.0.0/8` also holds for a
    public-looking name that resolves there.
    """
    port = url.port or _DEFAULT_PORTS[url.scheme]
    host = url.raw_host.decode("ascii").lower()
    try:
        canonical = canonical_net(f"[{host}]" if ":" in host else host)
    except UncanonicalTarget as exc:
        return ToolResult.error(f"cannot fetch {url}: {exc}")
    ip = _parse_ip(canonical[0])
    if ip is not None:
        return str(ip)
    try:
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return ToolResult.error(f"could not resolve {host!r}: {exc}")
    addresses = [_parse_ip(str(info[4][0]).split("%", 1)[0]) for info in infos]
    chosen = next((a for a in addresses if a is not None), None)
    if chosen is None:
        return ToolResult.error(f"{host!r} resolved to no usable address")
    if address_classes(chosen):
        target = f"[{chosen}]:{port}" if chosen.version == 6 else f"{chosen}:{port}"
        if not ctx.permits(Action(Act.NET, target)):
            return ToolResult.error(
                f"not fetched: {host!r} resolves to {chosen} ({', '.join(address_classes(chosen))}"
                "), which the policy does not allow; a rule must name that address or its class"
            )
    return str(chosen)


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


async def _get(url: httpx.URL, address: str) -> ToolResult:
    import httpx

    # Connect to the decided address; the server still sees its name (Host header), and TLS
    # still sends and verifies the name (SNI).
    connect_url = url.copy_with(host=address)
    headers = {"User-Agent": "handrail-fetch", "Host": url.netloc.decode("ascii")}
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    # trust_env=False: no proxy settings or ~/.netrc credentials from the host's environment
    # reach a URL the model chose.
    async with (
        httpx.AsyncClient(follow_redirects=False, trust_env=False,
                          timeout=httpx.Timeout(FETCH_TIMEOUT)) as client,
        client.stream("GET", connect_url, headers=headers,
                      extensions=extensions) as response,
    ):
        status = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
        structured: dict[str, Any] = {"url": str(url), "status": response.status_code}
        if response.is_redirect:
            location = response.headers.get("location", "")
            target = _resolve_location(url, location)
            structured["location"] = target
            return ToolResult.text(
                f"{status}\nredirects to {target} (not followed; fetch that URL if you need it)",
                structured=structured,
            )
        body = bytearray()
        # typeshed-style AsyncIterator; it is an async generator, closed here rather than left
        # to the garbage collector when we stop early.
        chunks_gen = cast("AsyncGenerator[bytes, None]", response.aiter_bytes())
        async with contextlib.aclosing(chunks_gen) as chunks:
            async for chunk in chunks:
                body += chunk
                if len(body) > FETCH_LIMIT_BYTES:
                    break
        truncated = len(body) > FETCH_LIMIT_BYTES
        del body[FETCH_LIMIT_BYTES:]
        content_type = response.headers.get("content-type", "")
        structured.update(content_type=content_type, truncated=truncated)
        size = f"{len(body)}{'+' if truncated else ''} bytes"
        if _is_text(content_type, body):
            text = body.decode(_charset(response), errors="replace")
            if truncated:
                text += f"\n[truncated: only the first {FETCH_LIMIT_BYTES} bytes are shown]"
        else:
            text = f"[binary body: {content_type or 'no content-type'}, {size}, not shown]"
        head = f"{status}\ncontent-type: {content_type or '(none)'}\n\n"
        return ToolResult((Text(head + text),), structured, is_error=response.is_error)


def _resolve_location(url: httpx.URL, location: str) -> str:
    import httpx

    if not location:
        return "(no Location header)"
    try:
        return str(url.join(location))
    except httpx.InvalidURL:
        return repr(location)


def _is_text(content_type: str, body: bytes | bytearray) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    if not mime:
        return b"\x00" not in body[:8192]
    return (mime.startswith("text/") or mime in _TEXT_TYPES or mime.endswith("+json")
            or mime.endswith("+xml"))


def _charset(response: httpx.Response) -> str:
    import codecs

    name = response.charset_encoding or "utf-8"
    try:
        codecs.lookup(name)
    except LookupError:
        return "utf-8"
    return name


def describe_http_error(exc: httpx.HTTPError, url: httpx.URL) -> str:
    """A model-facing sentence for a failed request (the one map of httpx's errors)."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return f"fetching {url} timed out ({type(exc).__name__})"
    if isinstance(exc, httpx.ConnectError):
        return f"could not connect to {net_target(url)}: {exc}"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"the server at {net_target(url)} broke the HTTP protocol: {exc}"
    if isinstance(exc, httpx.DecodingError):
        return f"the response from {url} could not be decoded: {exc}"
    return f"fetching {url} failed: {type(exc).__name__}: {exc}"
