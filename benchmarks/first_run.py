"""The first run of a fresh process against a warm one: the fixed cost a new process pays.

Each process imports handrail and the agent core, defines a tool and an agent (a host's
start-up, not counted), then times its first `agent.run` (one call, then the answer; memory
store) and then five more, taking their median as the warm figure. The host is `anyio.run`,
so the event loop's own imports are the host's, as they are in a program. CPU time of the
process (`time.process_time`). Medians over the processes; with `--against SRC` the same from
another checkout's `src/`, process by process in turn, and the ratio.

    git archive <commit> src | tar -x -C /tmp/base
    .venv/bin/python benchmarks/first_run.py --against /tmp/base/src --reps 9

Target (issue 38): the first run at most 20 ms over a warm one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r'''
import json, time
import anyio
import handrail as hr
from handrail.models import Scripted, call, reply
hr.Agent, hr.Toolbox

@hr.tool(server="demo", name="add", mutates=False)
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b

def agent():
    return hr.Agent(Scripted([call("demo/add", {"a": 1, "b": 2}), reply("3")]), [add])

async def main():
    start = time.process_time()
    await agent().run("add")
    first = time.process_time() - start
    warm = []
    for _ in range(5):
        start = time.process_time()
        await agent().run("add")
        warm.append(time.process_time() - start)
    print(json.dumps({"first": first * 1e3, "warm": sorted(warm)[2] * 1e3}))

anyio.run(main)
'''


def _measure(src: str | None) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled once, as an installed package is
    if src is not None:
        env["PYTHONPATH"] = src
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, check=True, timeout=120).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="another checkout's src/ to measure beside this one")
    parser.add_argument("--reps", type=int, default=9, help="processes per build (default 9)")
    args = parser.parse_args()
    builds: dict[str, str | None] = {"this": None}
    if args.against:
        builds["before"] = args.against
    for src in builds.values():
        _measure(src)  # write the bytecode caches first
    results: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
    for _ in range(args.reps):
        for name, src in builds.items():
            results[name].append(_measure(src))
    print("| build | first run, ms CPU | warm run, ms CPU | first - warm |")
    print("|---|---:|---:|---:|")
    over: dict[str, float] = {}
    for name, rows in results.items():
        first = statistics.median(r["first"] for r in rows)
        warm = statistics.median(r["warm"] for r in rows)
        over[name] = statistics.median(r["first"] - r["warm"] for r in rows)
        print(f"| {name} | {first:.1f} | {warm:.2f} | {over[name]:.1f} |")
    if "before" in over:
        print(f"\nfirst-run overhead, this / before: {over['this'] / over['before']:.2f}x")


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
