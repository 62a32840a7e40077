"""The tools that measure the audit chain's cost (issue 42) still measure it.

`scripts/audit_nochain_patch.py` makes a copy of the source without the chain, which
`benchmarks/audit_cost.py` and `benchmarks/instructions.py --against` compare with: when
the code moves on and an edit no longer applies, or the copy still chains, every figure
they print is wrong without a word. These tests run the copy for real.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import handrail

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(handrail.__file__).resolve().parents[1]  # (the tree under test: scripts/mutants)

pytestmark = pytest.mark.slow

RUN = """
import asyncio, sys
import handrail as hr
from handrail.models import Scripted, call, reply

@hr.tool(mutates=False)
async def add(a: int, b: int) -> int:
    return a + b

async def main():
    store = hr.Store.open(sys.argv[1])
    turns = [call("add", {"a": i, "b": 1}) for i in range(5)] + [reply("done")]
    result = await hr.Agent(Scripted(turns), [add], policy=hr.Policy.default()).run(
        "add", store=store)
    assert result.output == "done", result.outcome
    await store.close()

asyncio.run(main())
"""


def _patch(copy: Path) -> None:
    runpy.run_path(str(ROOT / "scripts" / "audit_nochain_patch.py"))["patch"](copy)


def _benchmark_name(script: str, name: str) -> Any:
    """`name` from running benchmarks/`script` (with that folder on the path, as when run)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return runpy.run_path(str(ROOT / "benchmarks" / script))[name]
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _run(src: Path, db: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-c", RUN, str(db)], env=env, check=True, timeout=120)


def _facts(db: Path) -> tuple[list[str], int]:
    con = sqlite3.connect(db)
    try:
        columns = [row[1] for row in con.execute("PRAGMA table_info(log)")]
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master")}
        facts = con.execute("SELECT count(*) FROM audit").fetchone()[0] if (
            "audit" in tables) else 0
        return columns, facts
    finally:
        con.close()


def test_the_copy_runs_without_the_chain_and_the_tree_with_it(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    _patch(copy)
    _run(copy, tmp_path / "off.db")
    _run(SRC, tmp_path / "on.db")
    off_columns, off_facts = _facts(tmp_path / "off.db")
    on_columns, on_facts = _facts(tmp_path / "on.db")
    # The tree chains every call (and the run's start and status); the copy chains nothing,
    # and its log has none of the fact columns.
    assert on_facts >= 7, on_facts
    assert off_facts == 0
    assert len(on_columns) - len(off_columns) == 5, (on_columns, off_columns)


def test_an_edit_that_no_longer_applies_stops_the_patch(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    sqlite = copy / "handrail" / "store" / "_sqlite.py"
    text = sqlite.read_text()
    moved = "self._tips = _Tips(None if memory else _data_version)"
    assert text.count(moved) == 1
    sqlite.write_text(text.replace(
        moved, "self._tips = _Tips(_data_version if not memory else None)"))
    with pytest.raises(SystemExit, match="update this script"):
        _patch(copy)
    assert "_Tips(_data_version if not memory" in sqlite.read_text()  # nothing half-written


def test_the_cost_benchmark_measures_both_phases(tmp_path: Path) -> None:
    # One child of `benchmarks/audit_cost.py`, on the tree: per call, for the run and the close.
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "audit_cost.py"),
                          "--child", "10"], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    report = json.loads(out.stdout.splitlines()[-1])
    for phase in ("run", "close"):
        assert set(report[phase]) == {"cpu", "user", "sys", "faults", "writes", "bytes"}
        assert report[phase]["cpu"] == pytest.approx(
            report[phase]["user"] + report[phase]["sys"])
    assert report["run"]["cpu"] > 0
    if Path("/proc/self/io").exists():
        assert report["run"]["writes"] > 0  # a durable call commits: the WAL is written


def test_the_interval_holds_the_median_and_narrows_with_agreement() -> None:
    cost = runpy.run_path(str(ROOT / "benchmarks" / "audit_cost.py"))
    wide = cost["_interval"]([-30.0, 5.0, 40.0, 12.0, 60.0, -10.0])
    narrow = cost["_interval"]([11.0, 12.0, 12.5, 11.5, 12.0, 11.8])
    assert wide[0] <= 8.5 <= wide[1]
    assert narrow[0] <= 11.9 <= narrow[1]
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 10
    assert cost["_interval"]([1.0, 2.0, 3.0]) == cost["_interval"]([1.0, 2.0, 3.0])  # seeded


def test_the_builds_compared_are_both_compiled(tmp_path: Path) -> None:
    # A child that compiles its sources at start-up runs with a different heap (fewer page
    # faults): the benchmarks compile every tree they compare first (`agent_loop.compiled`).
    compiled = _benchmark_name("agent_loop.py", "compiled")
    copy = _copy(tmp_path)
    compiled(copy)
    sources = sorted(copy.rglob("*.py"))
    assert sources
    for source in sources:
        cached = source.parent / "__pycache__" / (
            f"{source.stem}.{sys.implementation.cache_tag}.pyc")
        assert cached.is_file(), cached
        assert cached.stat().st_mtime >= source.stat().st_mtime


def test_native_shares_names_the_objects_perf_reports() -> None:
    # `benchmarks/native_shares.py` sums perf's samples by shared object under short names
    # (one row for every version of a library, and for each of CPython's extension modules).
    name = _benchmark_name("native_shares.py", "_dso_name")
    assert name("libsqlite3.so.0.8.6") == "libsqlite3"
    assert name("/usr/lib/x86_64-linux-gnu/libcrypto.so.3") == "libcrypto"
    assert name("_pydantic_core.cpython-311-x86_64-linux-gnu.so") == "_pydantic_core"
    assert name("libpython3.11.so.1.0") == "libpython3.11"
    assert name("[kernel.kallsyms]  ") == "[kernel.kallsyms]"


def test_against_compares_with_another_build_as_it_is(tmp_path: Path) -> None:
    # `--against SRC` (issue 42's "≤ 10 µs more than today", read against the tree of that
    # day): the second build is that tree, copied and compiled, not patched.
    builds = _benchmark_name("audit_cost.py", "_builds")
    other = _copy(tmp_path / "other")
    marker = other / "handrail" / "MARKER.py"
    marker.write_text("# the other build\n")
    on, off = builds(SRC, tmp_path / "work", other)
    assert (off / "handrail" / "MARKER.py").is_file()
    assert not (on / "handrail" / "MARKER.py").exists()
    sqlite = "handrail/store/_sqlite.py"
    # Unpatched: the copy still chains, byte for byte the tree it was given.
    assert (off / sqlite).read_text() == (other / sqlite).read_text()
    on2, off2 = builds(SRC, tmp_path / "work2")
    assert (off2 / sqlite).read_text() != (on2 / sqlite).read_text()  # the patched copy


def test_against_refuses_a_folder_that_is_not_a_build(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "audit_cost.py"),
                          "--against", str(tmp_path), "--pairs", "2"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 2
    assert f"--against {tmp_path}: not a handrail src/ folder" in out.stderr
