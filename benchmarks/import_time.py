"""Import time of handrail's public corners, beside the peers: fresh processes, medians.

Each statement runs in a fresh interpreter (bytecode present: every statement is run once
first), timed inside the process around the statement alone (the interpreter's own start is
not counted), median over the repeats. Also says whether the statement loaded pydantic and
rich: the policy, the store and the CLI's reading commands must need neither.

    .venv/bin/python benchmarks/import_time.py [--reps 11] [--src DIR]
    benchmarks/.peers-venv/bin/python benchmarks/import_time.py    # with the peers

`--src DIR` puts DIR (a `src` folder of another checkout, say the commit before a change)
first on the path, to measure before and after with the same interpreter; `--against DIR`
measures DIR and this checkout interleaved, repeat by repeat (on a shared machine the load
moves between two separate runs). CPU ms (process time) moves less with the load than wall.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

STATEMENTS = {
    "import handrail": "import handrail",
    "agent core (Agent, tool, Toolbox, Store, Policy)":
        "from handrail import Agent, tool, Toolbox, Store, Policy",
    "agent core + Manifest":
        "from handrail import Agent, tool, Toolbox, Store, Policy, Manifest",
    "hr.Policy": "from handrail import Policy",
    "hr.Store": "from handrail import Store",
    "hr.Manifest": "from handrail import Manifest",
    "CLI reading commands (handrail.cli._runs)": "import handrail.cli._runs",
    "Pydantic AI": "import pydantic_ai",
    "OpenAI Agents SDK": "import agents",
    "LangGraph": "import langgraph.graph, langgraph.prebuilt",
}

_CHILD = """
import sys, time, json
t0, c0 = time.perf_counter(), time.process_time()
{statement}
ms, cpu = 1e3 * (time.perf_counter() - t0), 1e3 * (time.process_time() - c0)
print(json.dumps({{"ms": ms, "cpu": cpu, "pydantic": "pydantic" in sys.modules,
                  "rich": "rich" in sys.modules}}))
"""


def _once(statement: str, env: dict[str, str]) -> dict[str, object] | None:
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(statement=statement)],
                          capture_output=True, text=True, env=env)
    if proc.returncode:
        return None
    row: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def _median(rows: list[dict[str, object]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--src", default="", help="a src folder to import handrail from")
    parser.add_argument("--against", default="",
                        help="another src folder (say main's): each repeat runs it and then "
                             "--src (or the installed handrail), interleaved, and the table "
                             "shows both")
    args = parser.parse_args()
    env = dict(os.environ)
    # Bytecode present, as an installed package has it: the first run of each statement
    # writes what is missing (some shells set PYTHONDONTWRITEBYTECODE, which would time
    # the compiler instead).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.src:
        env["PYTHONPATH"] = os.path.abspath(args.src)
    envs = {"": env}
    if args.against:
        envs = {"before": {**env, "PYTHONPATH": os.path.abspath(args.against)}, "after": env}
    print(f"## import time: median ms over {args.reps} fresh processes, bytecode present "
          f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
          + (f", handrail from {args.src}" if args.src else "")
          + (f", before = {args.against}, interleaved" if args.against else "") + ")\n")
    if args.against:
        print("| statement | ms before | ms after | CPU ms before | CPU ms after "
              "| loads pydantic (before / after) |")
        print("|---|---|---|---|---|---|")
    else:
        print("| statement | ms | CPU ms | loads pydantic | loads rich |")
        print("|---|---|---|---|---|")
    for label, statement in STATEMENTS.items():
        firsts = {k: _once(statement, e) for k, e in envs.items()}  # also writes bytecode
        if any(f is None for f in firsts.values()):
            print(f"| {label} | not installed |" + " |" * (4 if args.against else 3))
            continue
        rows: dict[str, list[dict[str, object]]] = {k: [] for k in envs}
        for _ in range(args.reps):
            for k, e in envs.items():
                row = _once(statement, e)
                if row is not None:
                    rows[k].append(row)
        loads = " / ".join("yes" if f and f["pydantic"] else "no" for f in firsts.values())
        if args.against:
            b, a = rows["before"], rows["after"]
            print(f"| {label} | {_median(b, 'ms'):,.0f} | {_median(a, 'ms'):,.0f} | "
                  f"{_median(b, 'cpu'):,.0f} | {_median(a, 'cpu'):,.0f} | {loads} |", flush=True)
        else:
            first = firsts[""]
            assert first is not None
            print(f"| {label} | {_median(rows[''], 'ms'):,.0f} | {_median(rows[''], 'cpu'):,.0f} "
                  f"| {loads} | {'yes' if first['rich'] else 'no'} |", flush=True)


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
