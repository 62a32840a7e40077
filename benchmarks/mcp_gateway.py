"""MCP both ways: what handrail adds to a trivial MCP tool call, beside the SDK alone.

Gateway (`handrail serve`), one stdio hop each, the official client calling `add(a, b)`:
  (a) direct: the SDK's own server (MCPServer) serving `add`
  (b) gateway: `handrail serve --stdio` serving the same `add` as an hr.tool, every call
      through the gate and recorded (SQLite store file, and in memory)
  (c) for information: `handrail serve` fronting the SDK server of (a) as an upstream
      `[[servers]]` entry (two stdio hops)

Client (an agent calling an MCP tool), the SDK server of (a) as the upstream:
  (a) the SDK's ClientSession.call_tool alone (the same figure as the direct case)
  (e) hr.Agent (scripted model, memory store) calling it through MCPToolset and the gate

Each variant: N calls after a warm-up, repeated; median µs per call. Target: (b) <= 1.15 x (a).

`--baseline DIR` adds (b) and (b') served by the handrail source tree in DIR (its `src`, e.g.
`git archive main src | tar -x -C DIR`), measured interleaved with this tree's: old against
new in the same run. `--gateway-only` leaves out (c) and (e).

`--in-process` measures handrail's own share instead, without any transport: the gateway's
`GatewaySession.call` (gate, record, result conversion) in a loop, memory and SQLite stores,
each in a fresh child process (after a 200-call warm-up), wall and process CPU µs per call;
with `--baseline`, the baseline tree's children alternate with this tree's.

    .venv/bin/python benchmarks/mcp_gateway.py [--calls 300] [--reps 5] [--baseline DIR]
    .venv/bin/python benchmarks/mcp_gateway.py --in-process [--calls 2000] [--baseline DIR]
    .venv/bin/python benchmarks/mcp_gateway.py --instructions 20,120 [--baseline DIR]

`--instructions N1,N2` counts what each server process executes per call (callgrind, the
marginal cost between N1 and N2 calls, as benchmarks/instructions.py counts a client): the
SDK's own server, and `handrail serve` (memory store) serving a local tool and fronting that
SDK server (whose own instructions are not counted: it is a child callgrind does not follow).
Each count is read from the running server (`callgrind_control -e`) before and after its
calls, so its start-up and exit are not in it: they moved a run's total by ~15,000,000
instructions, which a marginal of 200 calls read as ±75,000 a call (the 540,000-1,018,000
that (c) gave for the same code). A collection of the cyclic GC's oldest generation falling
in one run and not the other moves the difference by a hundred thousand or more a call
(serve's heap holds the SDK and pydantic's models); `--gc-off` disables the collector in
the server processes, leaving the work of the call itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this folder is sys.path[0]: nothing here may shadow a package it imports
# (this file was once `mcp.py`, which `import mcp` found first). Drop that entry first.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import anyio  # after the sys.path fix above

from mcp import ClientSession, StdioServerParameters, stdio_client

SDK_SERVER = '''
from mcp.server.mcpserver import MCPServer
server = MCPServer("bench")

@server.tool()
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b

server.run("stdio")
'''

HR_TOOLS = '''
import handrail as hr

@hr.tool(mutates=False)
async def add(a: int, b: int) -> int:
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


def _children() -> set[int]:
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


def _cpu_seconds(pids: set[int]) -> float:
    """user + system CPU seconds of these processes and their descendants (Linux /proc)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            kids: set[int] = set()
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    kids.update(int(p) for p in (task / "children").read_text().split())
            total += _cpu_seconds(kids)
    return total


class _Session:
    """One client session to a server, kept open across repeats."""

    def __init__(self, params: StdioServerParameters, name: str) -> None:
        self.params, self.name = params, name
        self.server_cpu: list[float] = []
        """Server-side CPU µs per call, per batch (robust to a loaded machine)."""

    async def __aenter__(self) -> _Session:
        self._stack = contextlib.AsyncExitStack()
        devnull = self._stack.enter_context(open(os.devnull, "w"))  # noqa: ASYNC230
        before = _children()
        read, write = await self._stack.enter_async_context(
            stdio_client(self.params, errlog=devnull))
        self.pids = _children() - before
        self.session = await self._stack.enter_async_context(ClientSession(read, write))
        await self.session.initialize()
        await self.batch(30)  # warm-up
        self.server_cpu.clear()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def batch(self, calls: int) -> float:
        """µs per call over `calls` sequential calls."""
        cpu = _cpu_seconds(self.pids)
        start = time.perf_counter()
        for i in range(calls):
            result = await self.session.call_tool(self.name, {"a": i, "b": 1})
            assert not result.is_error, result
        elapsed = time.perf_counter() - start
        self.server_cpu.append((_cpu_seconds(self.pids) - cpu) / calls * 1e6)
        return elapsed / calls * 1e6


class _AgentPath:
    """hr.Agent calling the SDK server's `add` through MCPToolset (memory store)."""

    def __init__(self, server: Path) -> None:
        self.server = server

    async def __aenter__(self) -> _AgentPath:
        import handrail as hr

        python = sys.executable
        self.policy = hr.Policy.default().layer("bench").allow("exec", f"{python} {self.server}")
        self.manifest = hr.Manifest.from_toml(MANIFEST_UPSTREAM.format(python=python,
                                                                       server=self.server))
        self.tools = hr.mcp.MCPToolset.stdio(python, [str(self.server)], name="up",
                                             policy=self.policy, manifest=self.manifest)
        await self.tools.__aenter__()
        await self.batch(30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.tools.__aexit__(None, None, None)

    async def batch(self, calls: int) -> float:
        import handrail as hr
        from handrail.models import Scripted, call, reply

        agent = hr.Agent(Scripted([*[call("up/add", {"a": i, "b": 1}) for i in range(calls)],
                                   reply("done")]),
                         [self.tools], policy=self.policy, manifest=self.manifest,
                         max_steps=calls + 2)
        start = time.perf_counter()
        result = await agent.run("add")
        elapsed = time.perf_counter() - start
        assert isinstance(result.outcome, hr.Completed), result.outcome
        return elapsed / calls * 1e6


def _serve_params(root: Path, target: str | None, store: str,
                  source: str | None = None) -> StdioServerParameters:
    args = ["-m", "handrail.cli", "serve", *([target] if target else []), "--stdio",
            "--store", store]
    # `source` (another tree's src) comes first on the path: it shadows the installed one.
    paths = [*([source] if source else []), str(root), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return StdioServerParameters(command=sys.executable, args=args, cwd=str(root), env=env)


async def main(calls: int, reps: int, baseline: str | None, gateway_only: bool) -> None:
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
        variants: list[tuple[str, Any]] = [
            ("(a) direct: SDK client -> SDK server", _Session(sdk, "add")),
            ("(b) SDK client -> handrail serve (SQLite file store)", _Session(
                _serve_params(local, "bench_tools:box", str(local / "runs.db")), "add")),
            ("(b') SDK client -> handrail serve (memory store)", _Session(
                _serve_params(local, "bench_tools:box", "memory"), "add")),
        ]
        if not gateway_only:
            variants += [
                # `add`, the name serve lists (one server keeps its tools' names): a name the
                # client never saw listed makes the SDK's client list the tools again after
                # every call, looking for its output schema (a second round trip a call).
                ("(c) SDK client -> handrail serve -> SDK server", _Session(
                    _serve_params(upstream, None, str(upstream / "runs.db")), "add")),
                ("(e) hr.Agent -> MCPToolset -> SDK server", _AgentPath(server)),
            ]
        if baseline is not None:
            source = baseline
            old = root / "old"
            old.mkdir()
            (old / "handrail.toml").write_text(MANIFEST_LOCAL)
            (old / "bench_tools.py").write_text(HR_TOOLS)
            variants += [
                ("(b) baseline tree: SDK client -> handrail serve (SQLite file store)", _Session(
                    _serve_params(old, "bench_tools:box", str(old / "runs.db"), source), "add")),
                ("(b') baseline tree: SDK client -> handrail serve (memory store)", _Session(
                    _serve_params(old, "bench_tools:box", "memory", source), "add")),
            ]
            if not gateway_only:
                old_up = root / "old_upstream"
                old_up.mkdir()
                (old_up / "handrail.toml").write_text(
                    MANIFEST_UPSTREAM.format(python=sys.executable, server=server))
                variants.append(("(c) baseline tree: SDK client -> handrail serve -> SDK server",
                                 _Session(_serve_params(old_up, None, str(old_up / "runs.db"),
                                                        source), "add")))
        samples: dict[str, list[float]] = {label: [] for label, _ in variants}
        async with contextlib.AsyncExitStack() as stack:
            opened = [(label, await stack.enter_async_context(v)) for label, v in variants]
            # Interleaved: each repeat measures every variant once, so a load spike on this
            # shared machine hits them alike.
            for _ in range(reps):
                for label, variant in opened:
                    samples[label].append(await variant.batch(calls))
        medians = {label: statistics.median(values) for label, values in samples.items()}
        direct = medians[variants[0][0]]
        print(f"\n{calls} calls x {reps} repeats (interleaved), median µs per call\n")
        cpu = {label: statistics.median(v.server_cpu) for label, v in opened
               if isinstance(v, _Session)}
        print("| case | µs/call (wall) | × (a) | server CPU µs/call |")
        print("|---|---|---|---|")
        for label, _ in variants:
            server = f"{cpu[label]:,.0f}" if label in cpu else "-"
            print(f"| {label} | {medians[label]:,.0f} | {medians[label] / direct:.2f} | "
                  f"{server} |")
        overhead = medians[variants[1][0]] / direct - 1
        print(f"\ngateway overhead (b vs a), wall: {overhead:+.1%} (target <= +15%)")
        added = cpu[variants[1][0]] - cpu[variants[0][0]]
        print(f"server CPU the gateway adds per call (b - a): {added:+,.0f} µs "
              f"({added / direct:+.1%} of the direct call's wall time)")
        labels = [label for label, _ in variants]
        for fronted in [label for label in labels if label.startswith("(c)")]:
            print(f"{fronted}: {medians[fronted] / direct:.2f}x the direct call, wall "
                  f"(target <= 1.15x); server CPU {cpu[fronted]:,.0f} µs/call")
        client = next((label for label in labels if label.startswith("(e)")), None)
        if client is not None:
            print(f"client path overhead (e vs a, the SDK alone): "
                  f"{medians[client] / direct - 1:+.1%}")
        old_b = next((label for label in labels if label.startswith("(b) baseline")), None)
        if old_b is not None:
            print(f"baseline tree's gateway overhead (b vs a), wall: "
                  f"{medians[old_b] / direct - 1:+.1%}; server CPU it adds per call: "
                  f"{cpu[old_b] - cpu[variants[0][0]]:+,.0f} µs")

IN_PROCESS_CHILD = '''
import json, os, shutil, sys, tempfile, time
import anyio
import handrail as hr
from handrail.mcp import Gateway
from handrail.mcp._content import to_mcp_result

sys.path.insert(0, sys.argv[3])
from bench_tools import box

async def main(kind: str, calls: int) -> None:
    folder = tempfile.mkdtemp()
    store = (hr.Store.memory() if kind == "memory"
             else hr.Store.open(os.path.join(folder, "runs.db")))
    manifest = hr.Manifest.from_toml(open(os.path.join(sys.argv[3], "handrail.toml")).read())
    gateway = Gateway(box, store=store, manifest=manifest, workspace=folder)
    session = await gateway.open_session("bench")
    for i in range(200):
        to_mcp_result(await session.call("add", {"a": i, "b": 1}))
    cpu, start = time.process_time(), time.perf_counter()
    for i in range(calls):
        to_mcp_result(await session.call("add", {"a": i, "b": 1}))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    await gateway.close()
    await store.close()
    shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({"wall": wall / calls * 1e6, "cpu": cpu / calls * 1e6}))

anyio.run(main, sys.argv[1], int(sys.argv[2]))
'''


def _running_count(pid: int) -> int:
    """The instructions a process running under callgrind has executed so far, all threads.

    Read from the running process (`callgrind_control -e`, through valgrind's gdbserver),
    which goes on: the count of a batch of calls is the difference of two reads, without
    the process's start or exit in it.
    """
    done = subprocess.run(["callgrind_control", "-e", str(pid)], capture_output=True,
                          text=True, timeout=120, check=False)
    counts = [int(line.split()[2].replace(",", "")) for line in done.stdout.splitlines()
              if line.split()[:1] == ["Th"] and len(line.split()) >= 3]
    if done.returncode != 0 or not counts:
        raise SystemExit(f"callgrind_control could not read process {pid}: "
                         f"{(done.stderr or done.stdout).strip()[:300]}")
    return sum(counts)


async def _server_instructions(params: StdioServerParameters, name: str, n: int,
                               gc_off: bool) -> int:
    """User-space instructions the server process of `params` spends on `n` calls.

    The server runs under callgrind (`--trace-children=no`: an upstream it starts is not
    counted), and its count is read while it runs, before and after the `n` calls
    (`_running_count`), after the session's start and 30 warm-up calls: its start-up and
    exit, whose count moved by ~15,000,000 instructions between runs of the same code
    (serve waits for its upstream's start, then for its exit), are not in it. With
    `gc_off`, a `sitecustomize` disables the cyclic collector in the server process.
    """
    with tempfile.TemporaryDirectory() as tmp:
        env = {**(params.env or os.environ), "PYTHONHASHSEED": "0"}
        if gc_off:
            (Path(tmp) / "sitecustomize.py").write_text("import gc\ngc.disable()\n")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [tmp, env.get("PYTHONPATH")]))
        wrapped = StdioServerParameters(
            command="valgrind",
            args=["--tool=callgrind", f"--callgrind-out-file={Path(tmp) / 'cg.out'}",
                  params.command, *params.args],
            env=env, cwd=params.cwd)
        session = _Session(wrapped, name)
        async with session:
            (pid,) = session.pids  # (valgrind runs the server in its own process)
            before = _running_count(pid)  # (the server waits for a request meanwhile)
            await session.batch(n)
            after = _running_count(pid)
        return after - before


async def instructions(ns: tuple[int, int], baseline: str | None, gc_off: bool) -> None:
    """Instructions per call of each server process: the SDK's (a), serve's (b') and (c)."""
    n1, n2 = ns
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = root / "sdk_server.py"
        server.write_text(SDK_SERVER)
        rows: list[tuple[str, StdioServerParameters, str]] = [
            ("(a) the SDK's server (MCPServer), add", StdioServerParameters(
                command=sys.executable, args=[str(server)]), "add")]
        for tree, source in [("this tree", None), *([("baseline", baseline)] if baseline
                                                      else [])]:
            local = root / f"local-{len(rows)}"
            local.mkdir()
            (local / "handrail.toml").write_text(MANIFEST_LOCAL)
            (local / "bench_tools.py").write_text(HR_TOOLS)
            up = root / f"up-{len(rows)}"
            up.mkdir()
            (up / "handrail.toml").write_text(
                MANIFEST_UPSTREAM.format(python=sys.executable, server=server))
            rows += [
                (f"(b') handrail serve, memory store, a local add ({tree})",
                 _serve_params(local, "bench_tools:box", "memory", source), "add"),
                (f"(c) handrail serve -> the SDK's server, memory store ({tree})",
                 _serve_params(up, None, "memory", source), "add"),
            ]
            # No SQLite rows: the store's fold at close grows with the calls made, so the
            # marginal of two runs counts it as a per-call cost of the hop.
        print(f"\nserver process instructions per call (callgrind, marginal N={n1} -> {n2}, "
              "hash seed 0; the client and an upstream not counted"
              f"{'; the cyclic collector off' if gc_off else ''})\n")
        print("| server process | instructions / call | × (a) |")
        print("|---|---:|---:|")
        direct = None
        for label, params, name in rows:
            small = await _server_instructions(params, name, n1, gc_off)
            big = await _server_instructions(params, name, n2, gc_off)
            per_call = (big - small) / (n2 - n1)
            direct = direct or per_call
            print(f"| {label} | {per_call:,.0f} | {per_call / direct:.2f} |", flush=True)


def in_process(calls: int, reps: int, baseline: str | None) -> None:
    """`GatewaySession.call` in a loop, in fresh child processes, trees alternating."""
    import json

    trees = [("this tree", None)] + ([("baseline", baseline)] if baseline else [])
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "bench_tools.py").write_text(HR_TOOLS)
        (root / "handrail.toml").write_text(MANIFEST_LOCAL)
        for _ in range(reps):
            for kind in ("memory", "sqlite"):
                for tree, source in trees:
                    paths = [*([source] if source else []), os.environ.get("PYTHONPATH", "")]
                    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
                    done = subprocess.run(
                        [sys.executable, "-c", IN_PROCESS_CHILD, kind, str(calls), str(root)],
                        env=env, capture_output=True, text=True, check=True)
                    samples.setdefault((kind, tree), []).append(json.loads(done.stdout))
    print(f"\nGatewaySession.call in process, {calls} calls x {reps} child processes "
          "(interleaved), median µs per call\n")
    print("| store | tree | wall µs | CPU µs |")
    print("|---|---|---|---|")
    for (kind, tree), values in samples.items():
        wall = statistics.median(v["wall"] for v in values)
        cpu = statistics.median(v["cpu"] for v in values)
        print(f"| {kind} | {tree} | {wall:,.0f} | {cpu:,.0f} |")


if __name__ == "__main__":
    # (this folder left sys.path above: back at its end, after the packages)
    sys.path.append(str(Path(__file__).resolve().parent))
    import calibration

    with calibration.beside():
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--calls", type=int, default=300)
        parser.add_argument("--reps", type=int, default=5)
        parser.add_argument("--baseline", metavar="DIR",
                            help="also serve (b) and (b') from the handrail tree in DIR")
        parser.add_argument("--gateway-only", action="store_true", help="leave out (c) and (e)")
        parser.add_argument("--in-process", action="store_true",
                            help="handrail's own share: GatewaySession.call, no transport")
        parser.add_argument("--instructions", metavar="N1,N2",
                            help="instructions per call of each server process (callgrind)")
        parser.add_argument("--gc-off", action="store_true",
                            help="with --instructions: the cyclic collector off in the servers")
        options = parser.parse_args()
        source = str(Path(options.baseline).resolve() / "src") if options.baseline else None
        if options.instructions:
            first, second = (int(x) for x in options.instructions.split(","))
            anyio.run(instructions, (first, second), source, options.gc_off)
        elif options.in_process:
            in_process(options.calls, options.reps, source)
        else:
            anyio.run(main, options.calls, options.reps, source, options.gateway_only)
