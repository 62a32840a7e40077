"""Where a call's CPU goes in the running loop, by library: perf's cpu-clock samples.

    .venv/bin/python benchmarks/native_shares.py [--variants handrail_sqlite,floor_sqlite]
        [--calls 2000] [--reps 3] [--against SRC] [--freq 4000]

Callgrind counts instructions, and on the 2-core VM a call's code runs two to three times
slower in the loop than alone in a tight loop (benchmarks/README.md, issue 42: caches, code
run once a call with a large footprint). This VM has no hardware counters, but perf's
software clock works: `perf record -e cpu-clock` samples the process every 1/`--freq`
second of its CPU time. Each child (`agent_loop.py`'s variants: handrail's loops and the
floor's) runs a warm-up, then perf is switched on (its control FIFO) for one run of
`--calls` calls only, and off again. The samples are counted by shared object: the
interpreter (libpython: all Python code), SQLite, libc, the kernel (system calls, page
faults), OpenSSL's libcrypto (the audit chain's SHA-256), ctypes and libffi, pydantic-core,
...: µs a call = samples / freq / calls, the median over `--reps` interleaved rounds.
A library's share of one process's samples does not move with the machine's speed the way
a µs figure does, so it is printed too.

`--against SRC` runs each handrail variant also from another build's `src/` (compiled
first, as the tree: `agent_loop.compiled`), as '<variant> (before)'. Needs perf (Debian:
linux-perf) and perf_event_paranoid ≤ 2; it is not part of the test command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from agent_loop import BEFORE, VARIANTS, WARMUP, compiled  # noqa: E402

DEFAULT_VARIANTS = "handrail_sqlite,floor_sqlite"
SHOWN = 14
"""The largest objects (or functions) printed one per row; the rest are summed in one."""


def _dso_name(path: str) -> str:
    """A short name for a shared object: `libsqlite3.so.0.8.6` -> `libsqlite3`."""
    name = os.path.basename(path.strip())
    if name.startswith("["):
        return name  # [kernel.kallsyms], [vdso], [unknown]
    name = re.sub(r"\.cpython-\d+[^.]*", "", name)
    return re.sub(r"\.so(\.[\d.]+)?$", "", name)


def child(variant: str, n: int, control: str, ack: str) -> None:
    """One variant's run at N, with perf enabled around the run alone."""
    import asyncio
    import gc
    import resource

    loop = asyncio.new_event_loop()
    loop.run_until_complete(VARIANTS[variant][1](WARMUP)())
    run = VARIANTS[variant][1](n)
    gc.collect()
    with open(control, "w") as ctl, open(ack) as acks:
        def perf(command: str) -> None:
            ctl.write(command + "\n")
            ctl.flush()
            # (perf answers "ack\n" and a NUL, which the next answer's line begins with)
            if acks.readline().strip("\x00\n ") != "ack":
                raise SystemExit(f"perf did not acknowledge {command!r}")

        perf("enable")
        before = resource.getrusage(resource.RUSAGE_SELF)
        calls = loop.run_until_complete(run())
        after = resource.getrusage(resource.RUSAGE_SELF)
        perf("disable")
    assert calls == n, (calls, n)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"variant": variant, "n": n, "cpu_us": cpu / n * 1e6}))


def _sample(variant: str, n: int, freq: int, src: str | None, folder: Path,
            within: str = "") -> tuple[dict[str, int], float]:
    """Samples by shared object over one run of `variant`, and the run's CPU µs a call.

    With `within` (a shared object's name as perf gives it, say `[kernel.kallsyms]` or
    `libsqlite3.so.0.8.6`): by function of that object instead.
    """
    control, ack, data = folder / "ctl", folder / "ack", folder / "perf.data"
    for fifo in (control, ack):
        if fifo.exists():
            fifo.unlink()
        os.mkfifo(fifo)
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.path.abspath(src)
    command = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(freq), "--delay=-1",
               f"--control=fifo:{control},{ack}", "-o", str(data), "--",
               sys.executable, __file__, "--child", variant, str(n), str(control), str(ack)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{variant}: perf record failed:\n{out.stderr[-2000:]}")
    cpu = json.loads(out.stdout.strip().splitlines()[-1])["cpu_us"]
    by = ["--dsos", within, "--sort", "sym"] if within else ["--sort", "dso"]
    report = subprocess.run(["perf", "report", "-i", str(data), *by, "-n", "--stdio", "-q"],
                            capture_output=True, text=True, timeout=300)
    samples: dict[str, int] = {}
    for line in report.stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0].endswith("%") and parts[1].isdigit():
            name = parts[2].strip() if within else _dso_name(parts[2])
            samples[name] = samples.get(name, 0) + int(parts[1])
    if not samples:
        raise SystemExit(f"{variant}: perf recorded no samples:\n{report.stderr[-2000:]}")
    return samples, cpu


def _report(names: list[str], n: int, freq: int,
            runs: dict[str, list[tuple[dict[str, int], float]]], within: str = "") -> None:
    per_call: dict[str, dict[str, float]] = {}
    shares: dict[str, dict[str, float]] = {}
    cpus: dict[str, float] = {}
    for name in names:
        objects = {o for samples, _ in runs[name] for o in samples}
        per_call[name] = {o: statistics.median(s.get(o, 0) / freq / n * 1e6
                                               for s, _ in runs[name]) for o in objects}
        shares[name] = {o: statistics.median(s.get(o, 0) / sum(s.values())
                                             for s, _ in runs[name]) for o in objects}
        cpus[name] = statistics.median(c for _, c in runs[name])
    total = {o: sum(per_call[name].get(o, 0.0) for name in names)
             for name in names for o in per_call[name]}
    ordered = sorted(total, key=total.get, reverse=True)  # type: ignore[arg-type]
    shown, rest = ordered[:SHOWN], ordered[SHOWN:]
    what = f"function of {within}" if within else "shared object"
    print(f"\nCPU µs a call by {what} (perf cpu-clock at {freq} Hz, {n} calls, median "
          f"of {len(next(iter(runs.values())))} rounds; the share of the process's samples "
          "in brackets):\n")
    print("| object | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for obj in shown:
        cells = [f"{per_call[name].get(obj, 0.0):.1f} ({shares[name].get(obj, 0.0):.0%})"
                 for name in names]
        print(f"| {obj} | " + " | ".join(cells) + " |")
    if rest:
        cells = [f"{sum(per_call[name].get(o, 0.0) for o in rest):.1f}" for name in names]
        print(f"| {len(rest)} others | " + " | ".join(cells) + " |")
    cells = [f"{sum(per_call[name].values()):.1f}" for name in names]
    print(f"| **all samples{' of ' + within if within else ''}** | " + " | ".join(cells) + " |")
    print("| the run's CPU (getrusage) | " + " | ".join(f"{cpus[name]:.1f}" for name in names)
          + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=DEFAULT_VARIANTS,
                        help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--freq", type=int, default=4000, help="samples a CPU second")
    parser.add_argument("--against", default="", help="another build's src/ folder")
    parser.add_argument("--within", default="", metavar="OBJECT",
                        help="by function of this shared object, as perf names it (say "
                             "'[kernel.kallsyms]' or 'libsqlite3.so.0.8.6')")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2], args.child[3])
        return
    wanted = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(wanted) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; they are {', '.join(VARIANTS)}")
    if args.calls < 1 or args.reps < 1 or not 1 <= args.freq <= 50_000:
        parser.error("--calls and --reps must be at least 1, --freq within 1..50,000")
    if shutil.which("perf") is None:
        sys.exit("perf is not installed (Debian: apt-get install linux-perf)")
    if args.against and not (Path(args.against) / "handrail").is_dir():
        parser.error(f"--against {args.against}: not a handrail src/ folder")
    compiled(HERE.parent / "src", *([args.against] if args.against else []))
    names = [n for v in wanted for n in (
        (v + BEFORE, v) if args.against and v.startswith("handrail") else (v,))]
    runs: dict[str, list[tuple[dict[str, int], float]]] = {name: [] for name in names}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="native-shares-") as folder:
        for rep in range(args.reps):
            for name in names:
                variant = name.removesuffix(BEFORE)
                src = args.against if name.endswith(BEFORE) else None
                runs[name].append(_sample(variant, args.calls, args.freq, src, Path(folder),
                                          args.within))
                print(f"round {rep + 1}/{args.reps}: {name} "
                      f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
    _report(names, args.calls, args.freq, runs, args.within)


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
