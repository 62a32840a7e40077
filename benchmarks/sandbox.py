"""What the program sandbox adds to `exec` (docs/sandbox.md): start-up of `true`, medians.

Rows: the program started directly; the same behind the bwrap prefix (a prefix built once:
the namespaces and mounts alone); `wrap()` itself (the workspace walk that expands the
policy, at a few workspace sizes); and the whole `workspace/exec` tool call, sandbox off
against auto. Run: .venv/bin/python benchmarks/sandbox.py [--reps 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

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
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=30)
    reps = parser.parse_args().reps
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
        prefixed = build(policy, small, bwrap).argv(true)
        rows.append(("spawn /bin/true in bwrap (prefix built)", median_ms(
            lambda: subprocess.run(prefixed, cwd=small, check=True), reps)))
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

        def exec_call(mode: str) -> None:
            async def go() -> None:
                handler = box.handler("workspace/exec", workspace=small)
                # A handler outside an agent run has no ctx.sandbox of its own: set the mode
                # through the environment's bwrap lookup instead.
                await handler.step(hr.Invoke("c", {"argv": true}))

            if mode == "off":
                os.environ["HANDRAIL_BWRAP"] = "/nonexistent/bwrap"
            try:
                anyio.run(go)
            finally:
                os.environ.pop("HANDRAIL_BWRAP", None)

        rows.append(("exec tool call, unconfined", median_ms(lambda: exec_call("off"), reps)))
        rows.append(("exec tool call, sandboxed (10 files)",
                     median_ms(lambda: exec_call("auto"), reps)))
    print(f"median ms over {reps} repeats (bwrap {bwrap})\n")
    print("| case | ms |\n|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.1f} |")


if __name__ == "__main__":
    main()
