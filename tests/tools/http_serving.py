"""`handrail serve --http` started for a test: its URL and what it said, then stopped.

One helper for every suite that talks to a real gateway over HTTP (tests/mcp, tests/doors):
it reads serve's stderr until the URL and the token line (or `--no-auth`) are printed, and
always stops the process, so no test leaves a server running.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import anyio
import pytest


@contextlib.asynccontextmanager
async def serving_http(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str],
                       ) -> AsyncIterator[tuple[str, str]]:
    """(url, what serve said up to its URL) of the serve command `argv`, until the block ends."""
    process = await anyio.open_process(list(argv), cwd=cwd, env=dict(env),
                                       stdout=subprocess.DEVNULL)
    try:
        assert process.stderr is not None
        said = ""
        with anyio.fail_after(60):
            async for chunk in process.stderr:
                said += chunk.decode()
                url = re.search(r"at (http://\S+/mcp)", said)
                # The whole token line: a chunk may end inside the file's path.
                if url and re.search(r"bearer token: [^\n]*\n|--no-auth", said):
                    break
            else:
                pytest.fail(f"handrail serve --http said only: {said}")
        yield url.group(1), said
    finally:
        process.terminate()
        with anyio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
        await process.aclose()


async def token_of(said: str) -> str:
    """The bearer token, read from the file serve said it is in (it never prints the token)."""
    where = re.search(r"bearer token: in (\S+)", said)
    assert where is not None, said
    token = (await anyio.Path(where.group(1)).read_text()).strip()
    assert token not in said
    return token
