"""Issue 33: `handrail serve --http` on every loopback address, its token, its errors.

The story, from a hostile probe:

- `--no-auth` on `[::1]`, or on a `127.x` other than `127.0.0.1`, had no Host/Origin check: a
  page using DNS rebinding could call tools;
- `Authorization: bearer TOKEN` (lower case) got 401 (schemes are case-insensitive, RFC 9110);
- the bearer token was printed to stderr, where service logs keep it;
- a token file others could read was used;
- a multi-line error was printed on one line with literal `\\n`.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from http_serving import serving_http
from serve_tools import MANIFEST

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
BODY = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "LAUNCH_LOG": str(root / "launched.log"),
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


@contextlib.asynccontextmanager
async def serving(root: Path, address: str, *args: str) -> AsyncIterator[tuple[str, str]]:
    """(url, what serve said) of `handrail serve --http ADDRESS ARGS`, until the block ends."""
    (root / "handrail.toml").write_text(MANIFEST)
    argv = [sys.executable, "-m", "handrail.cli", "serve", "serve_tools:box", "--http",
            address, "--store", "memory", *args]
    async with serving_http(argv, cwd=root, env=_env(root)) as served:
        yield served


HEADERS = {"accept": "application/json, text/event-stream"}


@pytest.mark.parametrize("address", ["[::1]:0", "127.0.0.2:0", "127.0.0.1:0"])
async def test_every_loopback_bind_checks_host_and_origin(tmp_path: Path,
                                                          address: str) -> None:
    async with serving(tmp_path, address, "--no-auth") as (url, _), httpx.AsyncClient() as c:
        netloc = url.split("/")[2]
        port = netloc.rsplit(":", 1)[1]
        for headers in ({"Host": "evil.example"}, {"Host": f"evil.example:{port}"},
                        {"Origin": "http://evil.example"}, {"Origin": "null"}):
            response = await c.post(url, json=BODY, headers={**HEADERS, **headers})
            assert response.status_code == 403, (headers, response.text)
        ok = await c.post(url, json=BODY, headers={**HEADERS, "Origin": f"http://{netloc}"})
        assert ok.status_code != 403, ok.text
        also = await c.post(url, json=BODY, headers={**HEADERS, "Host": f"localhost:{port}"})
        assert also.status_code != 403, also.text


async def test_the_token_is_in_a_private_file_never_printed_and_any_case_works(
        tmp_path: Path) -> None:
    async with serving(tmp_path, "127.0.0.1:0") as (url, said), httpx.AsyncClient() as c:
        where = re.search(r"bearer token: in (\S+)", said)
        assert where is not None, said
        token_file = anyio.Path(where.group(1))
        assert (await token_file.stat()).st_mode & 0o777 == 0o600
        assert (await token_file.parent.stat()).st_mode & 0o077 == 0
        token = (await token_file.read_text()).strip()
        assert len(token) >= 32 and token not in said
        for scheme in ("Bearer", "bearer", "BEARER"):
            response = await c.post(url, json=BODY,
                                    headers={**HEADERS, "Authorization": f"{scheme} {token}"})
            assert response.status_code not in (401, 403), (scheme, response.text)
        wrong = await c.post(url, json=BODY, headers={**HEADERS, "Authorization":
                                                      f"Basic {token}"})
        assert wrong.status_code == 401
    assert not await token_file.exists()  # removed when serve stops


async def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    (tmp_path / "handrail.toml").write_text(MANIFEST)
    token = tmp_path / "token"
    token.write_text("a-long-enough-token-0123456789\n")
    token.chmod(0o644)
    done = await anyio.run_process(
        [sys.executable, "-m", "handrail.cli", "serve", "serve_tools:box", "--http",
         "127.0.0.1:0", "--token-file", str(token)],
        cwd=tmp_path, env=_env(tmp_path), check=False)
    assert done.returncode == 1
    assert b"can be read by other users" in done.stderr
    assert f"chmod 600 {token}".encode() in done.stderr


async def test_a_multi_line_error_keeps_its_lines(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tools]]\nmutate = 1\nid = 'a/b'\n\n[[tools]]\nmutate = 2\nid = 'c/d'\n")
    done = await anyio.run_process(
        [sys.executable, "-m", "handrail.cli", "serve", "--manifest", str(bad)],
        cwd=tmp_path, env=_env(tmp_path), check=False)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "\\n" not in err
    lines = err.splitlines()
    assert lines[0].startswith("handrail: error: ") and len(lines) >= 2
    assert all(line.startswith("  ") for line in lines[1:])
