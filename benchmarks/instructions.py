"""Instructions per call (valgrind's callgrind): the loop and the MCP client, beside their floor.

Microseconds describe the machine and its load; instructions do not. Each case runs in a
child process under `valgrind --tool=callgrind` twice, at two sizes (N1 and N2 calls), and the
difference divided by N2 - N1 is the marginal cost of one call: imports, the warm-up and the
store's open and close cancel out. User-space instructions only (a syscall's kernel work is
not counted: an fsync is as cheap here as a write), of this one process (an MCP server is a
child valgrind does not follow: its own work is not counted either, on either side).

The `libcrypto` column is the part of a call's instructions spent in OpenSSL's libcrypto:
the audit chain's SHA-256 (issue 42; the floor hashes nothing). Valgrind hides the CPU's SHA
extensions (SHA-NI) from the program it runs, so OpenSSL takes its software path there: about
33 k instructions for a 1,000-byte SHA-256, which natively takes 1.2 µs with SHA-NI and 3.1 µs
without it (`OPENSSL_ia32cap=":~0x20000000"`) on the 2-core VM of benchmarks/README.md. Read
that column as "on a CPU without SHA extensions"; the rest of the count is unaffected.

Cases (rows):

- `floor_memory`: `../shared/bench-peers/floor.py`'s floor, memory — a scripted call, pydantic
  validation, the tool, the three records as JSON, one loop yield: the least a recorded call
  can cost in plain Python (`--floor PATH` names the file; rows say "missing" without it).
- `floor_sqlite`: the same + one WAL commit of one row (synchronous=NORMAL).
- `handrail_memory`, `handrail_sqlite`: `agent.run` with the scripted model calling a trivial
  `add`, the memory store / a SQLite file (as benchmarks/agent_loop.py builds it).
- `mcp_sdk`: the MCP SDK's `ClientSession.call_tool` to the SDK's own stdio server (`add`).
- `mcp_agent`: `hr.Agent` (memory store) calling that server's `add` through `MCPToolset`.

The ratios printed are the issue's targets (38): handrail memory / floor memory and handrail
SQLite / floor SQLite (target <= 2.0), the agent's MCP call / the SDK's call_tool (<= 1.15).

    .venv/bin/python benchmarks/instructions.py [--cases ...] [--ns 40,240] [--against SRC]

`--against SRC` (another checkout's `src/`, e.g. `git archive <commit> src | tar -x -C
/tmp/base`) also runs the handrail and MCP-agent cases from SRC, as '<case> (before)'.
Instruction counts are deterministic to a fraction of a percent: one repeat is enough.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the loop and the MCP paths are agent_loop.py's and mcp_gateway.py's
from agent_loop import FLOOR, _floor, compiled  # noqa: E402
from agent_loop import _handrail as _loop  # noqa: E402

DEFAULT_FLOOR = FLOOR or HERE.parent.parent / "shared" / "bench-peers" / "floor.py"
CASES = ["floor_memory", "floor_sqlite", "handrail_memory", "handrail_sqlite", "mcp_sdk",
         "mcp_agent"]
HANDRAIL_CASES = {"handrail_memory", "handrail_sqlite", "mcp_agent"}
RATIOS = [("handrail_memory", "floor_memory", 2.0), ("handrail_sqlite", "floor_sqlite", 2.0),
          ("mcp_agent", "mcp_sdk", 1.15)]


# --------------------------------------------------------------------------------- the child
async def _mcp(case: str, n: int) -> None:
    # mcp_gateway.py's server and client paths (each warms up 30 calls: the same in both
    # sizes, so it cancels out). Imported here: it imports the MCP SDK.
    import mcp_gateway as mg

    from mcp import StdioServerParameters

    with tempfile.TemporaryDirectory() as tmp:
        server = Path(tmp) / "sdk_server.py"
        server.write_text(mg.SDK_SERVER)
        path: Any = (mg._Session(StdioServerParameters(command=sys.executable,
                                                       args=[str(server)]), "add")
                     if case == "mcp_sdk" else mg._AgentPath(server))
        async with path:
            await path.batch(n)


def child(case: str, n: int, floor: str) -> None:
    loop = asyncio.new_event_loop()
    if case.startswith("mcp_"):
        loop.run_until_complete(_mcp(case, n))
        return
    if case.startswith("floor_"):
        mode = "memory" if case == "floor_memory" else "one"
        runs = [_floor(5, mode, floor), _floor(n, mode, floor)]
    else:
        kind = "memory" if case == "handrail_memory" else "sqlite"
        runs = [_loop(5, kind), _loop(n, kind)]
    for run in runs:  # the warm-up first: the same in both sizes, so it cancels out
        loop.run_until_complete(run())


# -------------------------------------------------------------------------------- the driver
def _crypto_share(out_file: str) -> int:
    """The instructions of a callgrind output spent in libcrypto (`callgrind_annotate`)."""
    listing = subprocess.run(["callgrind_annotate", "--threshold=100", out_file],
                             capture_output=True, text=True, check=True).stdout
    total = 0
    for line in listing.splitlines():
        found = re.match(r"\s*([\d,]+) \(.*\[[^\]]*/libcrypto[^\]/]*\]\s*$", line)
        if found:
            total += int(found.group(1).replace(",", ""))
    return total


def _instructions(case: str, n: int, floor: str, source: str | None) -> tuple[int, int]:
    """Instructions of the child at size `n`: all of them, and libcrypto's."""
    # One hash seed: set and dict orders (and so the collector's passes) are the same in
    # every child, which keeps two trees' counts comparable to a fraction of a percent.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
             sys.executable, __file__, "--child", case, str(n), "--floor", floor],
            env=env, capture_output=True, text=True, check=False)
        found = re.search(r"Collected : (\d+)", out.stderr)
        if out.returncode != 0 or found is None:
            raise RuntimeError(f"{case} at N={n} failed:\n{out.stderr[-2000:]}")
        return int(found.group(1)), _crypto_share(f"{tmp}/cg.out")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--ns", default="40,240", help="the two sizes, N1,N2")
    parser.add_argument("--floor", default=str(DEFAULT_FLOOR),
                        help="floor.py of ../shared/bench-peers (default: %(default)s)")
    parser.add_argument("--against", metavar="SRC", help="also run handrail's cases from SRC")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.floor)
        return
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; the cases are {', '.join(CASES)}")
    n1, n2 = (int(x) for x in args.ns.split(","))
    if not 0 < n1 < n2:
        parser.error("--ns takes two sizes N1,N2 with 0 < N1 < N2")
    if subprocess.run(["which", "valgrind"], capture_output=True).returncode != 0:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    compiled(HERE.parent / "src", *([args.against] if args.against else []))
    rows: list[tuple[str, str, str | None]] = [(c, c, None) for c in cases]
    if args.against:
        rows += [(f"{c} (before)", c, args.against) for c in cases if c in HANDRAIL_CASES]
    per_call: dict[str, float | None] = {}
    crypto: dict[str, float] = {}
    load = os.getloadavg()[0]
    for label, case, source in rows:
        if case.startswith("floor_") and not Path(args.floor).exists():
            per_call[label] = None
            continue
        (small, small_crypto) = _instructions(case, n1, args.floor, source)
        (big, big_crypto) = _instructions(case, n2, args.floor, source)
        per_call[label] = (big - small) / (n2 - n1)
        crypto[label] = (big_crypto - small_crypto) / (n2 - n1)
        print(f"  {label}: {per_call[label]:,.0f} instructions a call "
              f"({crypto[label]:,.0f} in libcrypto)", file=sys.stderr)
    print(f"\n## Instructions per call (callgrind, marginal N={n1} -> {n2}; load {load:.1f} "
          "does not move them)\n")
    print("| case | instructions / call | of which libcrypto (SHA-256, software path) |")
    print("|---|---|---|")
    for label, _, _ in rows:
        value = per_call[label]
        if value is None:
            print(f"| {label} | missing (--floor) | - |")
        else:
            print(f"| {label} | {value:,.0f} | {crypto[label]:,.0f} |")
    print("\n| ratio | measured | target |")
    print("|---|---|---|")
    for suffix in ("", " (before)"):
        for top, bottom, target in RATIOS:
            a, b = per_call.get(top + suffix), per_call.get(bottom)
            if a is not None and b:
                print(f"| {top}{suffix} / {bottom} | {a / b:.2f}x | <= {target}x |")


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
