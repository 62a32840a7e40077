"""What the program sandbox adds to starting a program (docs/sandbox.md), medians.

Rows: the program started directly; the same behind the bwrap prefix (a prefix built once:
the namespaces and mounts alone); `wrap()` itself (the workspace walk that expands the
policy, at a few workspace sizes); then, sandbox "off" against "auto" measured alternately
(so load drifts hit both alike): a whole `workspace/exec` call and a `SubprocessTool` call
of `/bin/true`, and starting a stdio MCP server (the official SDK's, entered and closed).
Wall ms and CPU ms (this process and its reaped children). Run:
.venv/bin/python benchmarks/sandbox.py [--reps 30] [--mcp-reps 7]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

import handrail as hr
from handrail.builtin import workspace_tools
from handrail.sandbox import _landlock, build, find_bwrap, wrap


def median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm (the bwrap probe runs once per process)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def alternately(argvs: dict[str, list[str]], cwd: Path, reps: int) -> dict[str, float]:
    """{name: median ms} of spawning each argv, the argvs taken in turn (load hits all)."""
    times: dict[str, list[float]] = {name: [] for name in argvs}
    for argv in argvs.values():
        subprocess.run(argv, cwd=cwd, check=True)
    for _ in range(reps):
        for name, argv in argvs.items():
            start = time.perf_counter()
            subprocess.run(argv, cwd=cwd, check=True)
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: statistics.median(t) for name, t in times.items()}


def cpu_seconds() -> float:
    """CPU of this process and of its children reaped so far."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


async def off_against_auto(fn: Callable[[str], Awaitable[Any]], reps: int
                           ) -> dict[str, tuple[float, float]]:
    """{mode: (median wall ms, median CPU ms)}, the two modes measured alternately.

    `fn(mode)` may return its own (wall ms, CPU ms) for the part that matters.
    """
    await fn("off")
    await fn("auto")  # warm: the bwrap probe, the first walk
    wall: dict[str, list[float]] = {"off": [], "auto": []}
    cpu: dict[str, list[float]] = {"off": [], "auto": []}
    for _ in range(reps):
        for mode in ("off", "auto"):
            c, w = cpu_seconds(), time.perf_counter()
            own = await fn(mode)
            if own is None:
                own = ((time.perf_counter() - w) * 1000, (cpu_seconds() - c) * 1000)
            wall[mode].append(own[0])
            cpu[mode].append(own[1])
    return {m: (statistics.median(wall[m]), statistics.median(cpu[m])) for m in wall}


MCP_SERVER = Path(__file__).resolve().parent.parent / "tests" / "mcp" / "fixture_server.py"


def workspace(root: Path, files: int) -> Path:
    ws = root / f"ws-{files}"
    for i in range(files):
        d = ws / f"d{i // 50}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.py").write_text("x")
    ws.mkdir(exist_ok=True)
    (ws / ".env").write_text("SECRET=1")
    return ws


def main() -> None:
    # This folder is on sys.path as the script's own, and its mcp.py would shadow the SDK.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--mcp-reps", type=int, default=7)
    args = parser.parse_args()
    reps, mcp_reps = args.reps, args.mcp_reps
    bwrap, why = find_bwrap()
    if bwrap is None:
        print(f"no usable bubblewrap: {why}")
        return
    policy = hr.Policy.default()
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        small = workspace(Path(tmp), 10)
        bigger = {n: workspace(Path(tmp), n) for n in (1_000, 10_000)}
        # Folders changed in the last 2 s are walked afresh every time (docs/sandbox.md):
        # measure the steady state of a workspace that is not being rewritten.
        time.sleep(2.5)
        true = ["/bin/true"]
        rows.append(("spawn /bin/true directly", median_ms(
            lambda: subprocess.run(true, cwd=small, check=True), reps)))
        sandbox = build(policy, small, bwrap)
        prefixed = sandbox.argv(true)
        rows.append(("spawn /bin/true in bwrap (prefix built)", median_ms(
            lambda: subprocess.run(prefixed, cwd=small, check=True), reps)))
        # Issue 33's costs, each pair measured alternately: the socket filter (a /bin/sh
        # that opens it, bwrap loading it) and the reaping launcher of sandbox "off".
        unfiltered = replace(sandbox, seccomp=None).argv(true)
        reaped = wrap(true, policy=policy, workspace=small, mode="off")[0]
        for name, ms in alternately({
                "spawn /bin/true in bwrap without the socket filter": unfiltered,
                "spawn /bin/true in bwrap with the socket filter": prefixed,
                "spawn /bin/true directly (again)": true,
                "spawn /bin/true through the reaping launcher (sandbox off)": reaped,
        }, small, reps).items():
            rows.append((name, ms))
        if _landlock.abi():
            landlocked = _landlock.launcher_argv(true, writable=[str(small)], deny_tcp=True)
            rows.append(("spawn /bin/true under the Landlock launcher", median_ms(
                lambda: subprocess.run(landlocked, cwd=small, check=True), reps)))
        for n in (10, 1_000, 10_000):
            ws = small if n == 10 else bigger[n]
            cold = time.perf_counter()
            wrap(true, policy=hr.Policy.default(), workspace=ws, mode="auto")
            rows.append((f"wrap() on a {n:,}-file workspace, first walk (a new policy)",
                         (time.perf_counter() - cold) * 1000))
            rows.append((f"wrap() on a {n:,}-file workspace, again", median_ms(
                lambda ws=ws: wrap(true, policy=policy, workspace=ws, mode="auto"), reps)))
        box = hr.Toolbox(workspace_tools())
        tool = hr.SubprocessTool("t", true, {"type": "object"}, "T.", cwd=small)
        argv = [sys.executable, str(MCP_SERVER)]
        mcp_policy = hr.Policy.default().layer("b").allow("exec", " ".join(argv))

        async def exec_call(mode: str) -> None:
            handler = box.handler("workspace/exec", workspace=small, sandbox=mode)
            out = await handler.step(hr.Invoke("c", {"argv": true}))
            assert isinstance(out, hr.Finished), out

        async def tool_call(mode: str) -> None:
            handler = hr.ToolHandler(tool, workspace=small, sandbox=mode)
            out = await handler.step(hr.Invoke("c", {}))
            assert isinstance(out, hr.Finished) and not out.result.is_error, out

        async def mcp_start(mode: str) -> tuple[float, float]:
            # Until the server has answered initialize and tools/list (closing is left out:
            # the SDK's shutdown waits). CPU: this process only (the server is not reaped
            # yet, and a confined one is never reaped by us).
            w, c = time.perf_counter(), time.process_time()
            async with hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name="fx", workspace=small,
                                               policy=mcp_policy, sandbox=mode) as tools:
                took = ((time.perf_counter() - w) * 1000, (time.process_time() - c) * 1000)
                assert tools.confinement is not None
                assert tools.confinement["mechanism"] == ("none" if mode == "off" else "bwrap")
            return took

        async def paired() -> list[tuple[str, dict[str, tuple[float, float]]]]:
            return [("exec tool call", await off_against_auto(exec_call, reps)),
                    ("SubprocessTool call", await off_against_auto(tool_call, reps)),
                    ("stdio MCP server start (its CPU not counted)",
                     await off_against_auto(mcp_start, mcp_reps))]

        pairs = anyio.run(paired)
    print(f"median ms over {reps} repeats (bwrap {bwrap})\n")
    print("| case | ms |\n|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.1f} |")
    print(f"\noff against auto, alternately (MCP: {mcp_reps} repeats): median ms\n")
    print("| case | wall off | wall auto | added | CPU off | CPU auto | added |")
    print("|---|---|---|---|---|---|---|")
    for name, by in pairs:
        (w0, c0), (w1, c1) = by["off"], by["auto"]
        print(f"| {name} | {w0:.1f} | {w1:.1f} | {w1 - w0:+.1f} | {c0:.1f} | {c1:.1f} "
              f"| {c1 - c0:+.1f} |")


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
