"""Import time of handrail's public corners, beside the peers: fresh processes, medians.

Each statement runs in a fresh interpreter (bytecode present: every statement is run once
first), timed inside the process around the statement alone (the interpreter's own start is
not counted), median over the repeats. Also says whether the statement loaded pydantic and
rich: the policy, the store and the CLI's reading commands must need neither.

    .venv/bin/python benchmarks/import_time.py [--reps 11] [--src DIR]
    benchmarks/.peers-venv/bin/python benchmarks/import_time.py    # with the peers

`--src DIR` puts DIR (a `src` folder of another checkout, say the commit before a change)
first on the path, to measure before and after with the same interpreter.
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
    "agent core (Agent, tool, Toolbox, Store, Policy, Manifest)":
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
t0 = time.perf_counter()
{statement}
ms = 1e3 * (time.perf_counter() - t0)
print(json.dumps({{"ms": ms, "pydantic": "pydantic" in sys.modules,
                  "rich": "rich" in sys.modules}}))
"""


def _once(statement: str, env: dict[str, str]) -> dict[str, object] | None:
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(statement=statement)],
                          capture_output=True, text=True, env=env)
    if proc.returncode:
        return None
    row: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--src", default="", help="a src folder to import handrail from")
    args = parser.parse_args()
    env = dict(os.environ)
    # Bytecode present, as an installed package has it: the first run of each statement
    # writes what is missing (some shells set PYTHONDONTWRITEBYTECODE, which would time
    # the compiler instead).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.src:
        env["PYTHONPATH"] = os.path.abspath(args.src)
    print(f"## import time: median ms over {args.reps} fresh processes, bytecode present "
          f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
          + (f", handrail from {args.src}" if args.src else "") + ")\n")
    print("| statement | ms | loads pydantic | loads rich |")
    print("|---|---|---|---|")
    for label, statement in STATEMENTS.items():
        first = _once(statement, env)  # also writes any missing bytecode
        if first is None:
            print(f"| {label} | not installed | | |")
            continue
        rows = [r for r in (_once(statement, env) for _ in range(args.reps)) if r is not None]
        ms = statistics.median(float(r["ms"]) for r in rows)  # type: ignore[arg-type]
        print(f"| {label} | {ms:,.0f} | {'yes' if first['pydantic'] else 'no'} | "
              f"{'yes' if first['rich'] else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
