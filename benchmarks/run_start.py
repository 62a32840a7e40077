"""What a run's start and a resume cost: the fixed price every door pays once per run.

`start`: `agent.run` of a one-call run (one read, then the answer), memory store — the run's
record, its governance, its scope and gate, two turns. `resume`: a run paused at a write
(SQLite file) continued with `hr.resume_with_decision` — the check of its recorded
governance, the claim, the rebuild of its history, the approved call, the answer. Each is
timed K times in a fresh process (after a warm-up); the driver prints medians over the
processes, and with `--against SRC` the same measured from another checkout's `src/`,
interleaved process by process, and the ratio. The figure is CPU time (`time.process_time`,
every thread of the process): on a machine shared with other work, wall time measures the
neighbours more than the code.

    git archive <commit> src | tar -x -C /tmp/base
    .venv/bin/python benchmarks/run_start.py --against /tmp/base/src --reps 11
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

K = 200
"""Runs (or resumes) timed per process."""


def _child(kind: str, k: int) -> None:
    import anyio

    import handrail as hr
    from handrail.builtin import WriteFile
    from handrail.models import Scripted, call, reply

    @hr.tool(mutates=False)
    async def add(a: int, b: int) -> int:
        return a + b

    tmp = Path(tempfile.mkdtemp())

    async def start_once() -> None:
        agent = hr.Agent(Scripted([call("add", {"a": 1, "b": 2}), reply("3")]), [add],
                         workspace=tmp)
        result = await agent.run("add", store=hr.Store.memory())
        assert result.output == "3", result.outcome

    turns = [call("workspace/write_file", {"path": "n.txt", "content": "x"}), reply("ok")]
    agent = hr.Agent(Scripted(turns), [WriteFile], workspace=tmp)

    async def main() -> list[float]:
        times: list[float] = []
        if kind == "start":
            for _ in range(20):
                await start_once()
            for _ in range(k):
                t = time.process_time()
                await start_once()
                times.append(time.process_time() - t)
            return times
        async with hr.Store.open(tmp / "runs.db") as store:
            paused = []
            for _ in range(k + 20):
                result = await agent.run("write", store=store)
                paused.append(result.outcome.request_id)  # type: ignore[union-attr]
            for i, rid in enumerate(paused):
                t = time.process_time()
                done = await hr.resume_with_decision(store, rid, hr.Decision.approve(),
                                                     agent=agent)
                if i >= 20:
                    times.append(time.process_time() - t)
                assert done.output == "ok", done.outcome
        return times

    times = anyio.run(main)
    print(json.dumps({"median_us": statistics.median(times) * 1e6}))


def _measure(kind: str, src: str | None, k: int) -> float:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(k)], env=env,
                         capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.splitlines()[-1])["median_us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="processes per variant")
    parser.add_argument("--k", type=int, default=K, help="runs timed per process")
    parser.add_argument("--against", default="", help="another checkout's src/ to compare")
    parser.add_argument("--kinds", default="start,resume", help="what to time (comma-separated)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return
    builds = [("this", None)] + ([("before", args.against)] if args.against else [])
    print("| what | build | median CPU µs (per run) | ratio to before |")
    print("|------|-------|------------------------:|----------------:|")
    for kind in args.kinds.split(","):
        found: dict[str, list[float]] = {name: [] for name, _ in builds}
        for _ in range(args.reps):  # interleaved: load changes hit both builds alike
            for name, src in builds:
                found[name].append(_measure(kind, src, args.k))
        medians: dict[str, Any] = {name: statistics.median(v) for name, v in found.items()}
        for name, _ in builds:
            ratio = (f"{medians[name] / medians['before']:.3f}" if "before" in medians
                     else "-")
            print(f"| {kind} | {name} | {medians[name]:.0f} | {ratio} |")


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
