"""Every benchmark prints the machine's calibration beside its tables (issue 38:
`benchmarks/calibration.py`), measured in its own run, and its children print none."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

FAKE_FLOOR = '''
import asyncio, time

async def floor_loop(n, mode, path):
    # A call of a known cost in CPU: 50 µs (memory) or 100 µs (one), spun, not slept,
    # after a run's fixed cost of 5 ms (which the marginal figure leaves out).
    each = 50e-6 if mode == "memory" else 100e-6
    end = time.process_time() + 5e-3
    while time.process_time() < end:
        pass
    for _ in range(n):
        end = time.process_time() + each
        while time.process_time() < end:
            pass
    await asyncio.sleep(0)
'''


@pytest.fixture
def calibration(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import calibration as module

    return module


def _main_block(path: Path) -> ast.If | None:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            return node
    return None


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")
                                          if p.name != "calibration.py"))
def test_every_benchmark_runs_its_main_beside_the_calibration(script: str) -> None:
    block = _main_block(BENCHMARKS / script)
    assert block is not None, f"{script} has no `if __name__ == '__main__':` block"
    withs = [node for node in block.body if isinstance(node, ast.With)]
    assert any(ast.unparse(item.context_expr) == "calibration.beside()"
               for node in withs for item in node.items), (
        f"{script}: its main block must run under `with calibration.beside():`")
    # Everything but imports and a final exit runs inside it.
    outside = [ast.unparse(node) for node in block.body
               if not isinstance(node, ast.With | ast.Import | ast.ImportFrom)]
    allowed = ("sys.exit(code)", "sys.path.append(str(Path(__file__).resolve().parent))")
    assert all(line in allowed for line in outside), outside


def test_the_floor_is_measured_as_marginal_cpu_per_call(calibration, tmp_path: Path) -> None:
    floor = tmp_path / "floor.py"
    floor.write_text(FAKE_FLOOR)
    figures = calibration.measure(small=20, large=120, reps=3, floor=floor)
    assert set(figures) == {"memory", "one"}
    assert figures["memory"] == pytest.approx(50, rel=0.3)
    assert figures["one"] == pytest.approx(100, rel=0.3)
    text = calibration.line(figures)
    assert f"the floor's call {figures['memory']:.1f} µs" in text
    assert f"with one WAL commit {figures['one']:.1f} µs" in text and "load" in text


def test_bad_sizes_are_refused_with_what_to_pass(calibration) -> None:
    with pytest.raises(ValueError, match="0 < small < large"):
        calibration.measure(small=100, large=100)


def test_a_missing_floor_is_said_not_measured(calibration, tmp_path: Path) -> None:
    text = calibration.calibration(tmp_path / "absent.py")
    assert text.startswith("calibration: not measured (") and "floor.py" in text


def test_a_failing_floor_is_said_with_its_error(calibration, tmp_path: Path) -> None:
    floor = tmp_path / "floor.py"
    floor.write_text("raise RuntimeError('the floor broke')\n")
    text = calibration.calibration(floor)
    assert "not measured" in text and "the floor broke" in text


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "bench.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(BENCHMARKS)!r})\n"
        "import calibration\n"
        f"calibration.FLOOR = {str(tmp_path / 'floor.py')!r}\n"
        "with calibration.beside():\n"
        f"    {body}\n")
    (tmp_path / "floor.py").write_text(FAKE_FLOOR)
    return script


def _run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "HANDRAIL_BENCH_CALIBRATED"}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          env={**environ, **env}, timeout=120, check=False)


def test_the_line_follows_the_tables_and_children_print_none(tmp_path: Path) -> None:
    script = _script(tmp_path, "print('| the table |')")
    out = _run(script)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "| the table |" and lines[-1].startswith("calibration (this run")
    # A child: started by a calibrated parent (its environment), or with a child's flag.
    for child in (_run(script, HANDRAIL_BENCH_CALIBRATED="1"), _run(script, "--child")):
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "| the table |"


def test_a_failed_benchmark_prints_no_calibration(tmp_path: Path) -> None:
    out = _run(_script(tmp_path, "raise SystemExit('no server')"))
    assert out.returncode == 1 and "calibration" not in out.stdout


def test_a_child_a_benchmark_starts_inherits_that_it_is_calibrated(tmp_path: Path) -> None:
    # The child (the same script, any argument) writes to the parent's stdout: one line.
    script = _script(tmp_path, "import subprocess; sys.argv[1:] or subprocess.run("
                               "[sys.executable, __file__, 'inner'], check=True)")
    out = _run(script)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("calibration (this run") == 1, out.stdout


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")
                                          if "argparse" in p.read_text()
                                          and p.name != "calibration.py"))
def test_every_benchmark_finds_the_calibration_where_it_runs(script: str) -> None:
    # A script that takes its folder off sys.path (a file there would shadow a package)
    # must still import calibration.py: `--help` runs the main block's import, then exits.
    out = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 0 or "needs the" in out.stdout + out.stderr, out
