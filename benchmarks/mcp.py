"""MCP both ways: what handrail adds to a trivial MCP tool call, beside the SDK alone.

Gateway (`handrail serve`), one stdio hop each, the official client calling `add(a, b)`:
  (a) direct: the SDK's own server (MCPServer) serving `add`
  (b) gateway: `handrail serve --stdio` serving the same `add` as an hr.tool, every call
      through the gate and recorded (SQLite store file, and in memory)
  (c) for information: `handrail serve` fronting the SDK server of (a) as an upstream
      `[[servers]]` entry (two stdio hops)

Client (an agent calling an MCP tool), the SDK server of (a) as the upstream:
  (d) the SDK's ClientSession.call_tool alone
  (e) hr.Agent (scripted model, memory store) calling it through MCPToolset and the gate

Each variant: N calls after a warm-up, repeated; median µs per call. Target: (b) <= 1.15 x (a).

    .venv/bin/python benchmarks/mcp.py [--calls 300] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

# This script is named after the package it measures: run as a script, its own folder is
# sys.path[0] and `import mcp` would import this file. Drop that entry first.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import anyio  # noqa: E402  # after the sys.path fix above
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402

SDK_SERVER = '''
from mcp.server.mcpserver import MCPServer
server = MCPServer("bench")

@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b

server.run("stdio")
'''

HR_TOOLS = '''
import handrail as hr

@hr.tool(mutates=False)
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b

box = hr.Toolbox([add])
'''

MANIFEST_LOCAL = '''
[[tools]]
ref = "local/add"
description = "Add two numbers."
mutates = false
'''

MANIFEST_UPSTREAM = '''
[[tools]]
ref = "up/add"
description = "Add two numbers."
mutates = false

[policy]
extends = "default"

[[policy.layers]]
name = "servers"
allow = ["exec:{python} {server}"]

[[servers]]
name = "up"
command = "{python}"
args = ["{server}"]
'''


async def _time_session(params: StdioServerParameters, name: str, calls: int,
                        reps: int) -> list[float]:
    """Median-able µs/call samples for `reps` batches of `calls` over one session."""
    samples = []
    with open(os.devnull, "w") as devnull:  # noqa: ASYNC230  # the child's stderr
        async with stdio_client(params, errlog=devnull) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            for i in range(20):  # warm-up
                await session.call_tool(name, {"a": i, "b": 1})
            for _ in range(reps):
                start = time.perf_counter()
                for i in range(calls):
                    result = await session.call_tool(name, {"a": i, "b": 1})
                    assert not result.is_error, result
                samples.append((time.perf_counter() - start) / calls * 1e6)
    return samples


async def _time_agent(server: Path, calls: int, reps: int) -> list[float]:
    import handrail as hr
    from handrail.models import Scripted, call, reply

    python = sys.executable
    policy = hr.Policy.default().layer("bench").allow("exec", f"{python} {server}")
    manifest = hr.Manifest.from_toml(MANIFEST_UPSTREAM.format(python=python, server=server))
    samples = []
    async with hr.mcp.MCPToolset.stdio(python, [str(server)], name="up", policy=policy,
                                       manifest=manifest) as tools:
        def agent(n: int) -> hr.Agent:
            return hr.Agent(Scripted([*[call("up/add", {"a": i, "b": 1}) for i in range(n)],
                                      reply("done")]),
                            [tools], policy=policy, manifest=manifest, max_steps=n + 2)

        await agent(20).run("warm up")
        for _ in range(reps):
            a = agent(calls)
            start = time.perf_counter()
            result = await a.run("add")
            samples.append((time.perf_counter() - start) / calls * 1e6)
            assert isinstance(result.outcome, hr.Completed), result.outcome
    return samples


def _serve_params(root: Path, target: str | None, store: str) -> StdioServerParameters:
    args = ["-m", "handrail.cli", "serve", *([target] if target else []), "--stdio",
            "--store", store]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root),
                                                         os.environ.get("PYTHONPATH", "")])}
    return StdioServerParameters(command=sys.executable, args=args, cwd=str(root), env=env)


async def main(calls: int, reps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = root / "sdk_server.py"
        server.write_text(SDK_SERVER)
        (root / "bench_tools.py").write_text(HR_TOOLS)
        local = root / "local"
        local.mkdir()
        (local / "handrail.toml").write_text(MANIFEST_LOCAL)
        (local / "bench_tools.py").write_text(HR_TOOLS)
        upstream = root / "upstream"
        upstream.mkdir()
        (upstream / "handrail.toml").write_text(
            MANIFEST_UPSTREAM.format(python=sys.executable, server=server))

        sdk = StdioServerParameters(command=sys.executable, args=[str(server)])
        rows: list[tuple[str, Callable[[], Awaitable[list[float]]]]] = [
            ("(a) direct: SDK client -> SDK server", lambda: _time_session(
                sdk, "add", calls, reps)),
            ("(b) SDK client -> handrail serve (SQLite file store)", lambda: _time_session(
                _serve_params(local, "bench_tools:box", str(local / "runs.db")), "add",
                calls, reps)),
            ("(b') SDK client -> handrail serve (memory store)", lambda: _time_session(
                _serve_params(local, "bench_tools:box", "memory"), "add", calls, reps)),
            ("(c) SDK client -> handrail serve -> SDK server", lambda: _time_session(
                _serve_params(upstream, None, str(upstream / "runs.db")), "up--add",
                calls, reps)),
            ("(d) SDK ClientSession.call_tool alone", lambda: _time_session(
                sdk, "add", calls, reps)),
            ("(e) hr.Agent -> MCPToolset -> SDK server", lambda: _time_agent(
                server, calls, reps)),
        ]
        medians: dict[str, float] = {}
        for label, run in rows:
            samples = await run()
            medians[label] = statistics.median(samples)
        direct = medians[rows[0][0]]
        alone = medians[rows[4][0]]
        print(f"\n{calls} calls x {reps} repeats, median µs per call\n")
        print("| case | µs/call | × direct |")
        print("|---|---|---|")
        for label, _ in rows:
            base = alone if label.startswith("(e)") or label.startswith("(d)") else direct
            print(f"| {label} | {medians[label]:,.0f} | {medians[label] / base:.2f} |")
        overhead = medians[rows[1][0]] / direct - 1
        print(f"\ngateway overhead (b vs a): {overhead:+.1%} (target <= +15%)")
        print(f"client path overhead (e vs d): {medians[rows[5][0]] / alone - 1:+.1%}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    options = parser.parse_args()
    anyio.run(main, options.calls, options.reps)
