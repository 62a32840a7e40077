"""The suite's own checks (tests/conftest.py): a process left running fails the session; the
tree under test ($HANDRAIL_TEST_SRC, scripts/mutants) is what child processes import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).parent

pytestmark = pytest.mark.slow

# Each leaking test lasts a few clock ticks (1/100 s) after its Popen: the check names the
# test a process started during by its start time in ticks, and on a quiet machine the next
# test would begin within the same tick.
LEAKY = '''
import os, subprocess, sys, time

def test_before():
    pass

def test_leaks_a_grandchild():
    # The child exits at once; its own child (a grandchild, orphaned) runs on, in an
    # environment built from scratch but for the marker it inherits.
    keep = {k: v for k, v in os.environ.items() if k.startswith("HANDRAIL_TEST")}
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen("
                    "[sys.executable, '-c', 'import time; time.sleep(120)', 'TOKEN'])"],
                   env={"PATH": os.environ["PATH"], **keep}, check=True)
    time.sleep(0.05)

def test_leaks_a_child():
    global CHILD
    CHILD = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "TOKEN"],
                             env={"PATH": os.environ["PATH"]})
    time.sleep(0.05)

def test_forgets_to_wait():
    global EXITED
    EXITED = subprocess.Popen([sys.executable, "-c", "pass", "TOKEN"])
    time.sleep(0.05)

def test_after():
    pass
'''


def _session(tmp_path: Path, tests: str, token: str = "") -> subprocess.CompletedProcess[str]:
    for name in ("conftest.py", "pgserver.py"):
        shutil.copy2(HERE / name, tmp_path / name)
    (tmp_path / "test_inner.py").write_text(tests.replace("TOKEN", token))
    env = {**os.environ, "HANDRAIL_TEST_LEFTOVER_WAIT": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
                           "-p", "no:cacheprovider", "-p", "no:xdist", "-W",
                           "ignore::ResourceWarning", "test_inner.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_process_left_running_fails_the_session_and_is_killed(tmp_path: Path) -> None:
    token = f"leak-{uuid.uuid4().hex}"  # its processes, not another test's
    done = _session(tmp_path, LEAKY, token)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "5 passed, 1 error" in out, out
    assert "processes left by the tests (now killed and reaped)" in out, out
    assert out.count(token) >= 2, out
    assert "started during test_inner.py::test_leaks_a_grandchild" in out, out
    assert "started during test_inner.py::test_leaks_a_child" in out, out
    assert "(exited, never waited for)', started during test_inner.py::test_forgets_to_wait" \
        in out, out
    # Killed: nothing of the inner session's runs on (the outer session's check would say so).
    left = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True)
    assert left.stdout == "", left.stdout


def test_a_session_whose_processes_all_ended_passes(tmp_path: Path) -> None:
    done = _session(tmp_path, "import subprocess, sys\n\ndef test_waits():\n"
                              "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_child_python_imports_the_tree_under_test_whatever_its_pythonpath(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    (src / "handrail").mkdir(parents=True)
    (src / "handrail" / "__init__.py").write_text("")
    monkeypatch.setenv("HANDRAIL_TEST_SRC", str(src))
    code = ["-c", "import handrail, os; print(handrail.__file__, os.environ['PYTHONPATH'])"]
    for env in ({**os.environ, "PYTHONPATH": str(tmp_path)}, None,
                {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}):
        out = subprocess.run([sys.executable, *code], env=env, capture_output=True, text=True,
                             check=True).stdout.split()
        assert out[0] == str(src / "handrail" / "__init__.py"), (env and env.get("PYTHONPATH"))
        assert out[1].split(os.pathsep)[0] == str(src)
    monkeypatch.delenv("HANDRAIL_TEST_SRC")
    out = subprocess.run([sys.executable, *code], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] != str(src / "handrail" / "__init__.py")


def test_every_planted_bug_still_finds_the_text_it_replaces() -> None:
    # A mutant whose original text moved is not planted at all (`scripts/mutants` says STALE
    # only when it is run): after a merge, ten had gone stale unseen. Each original must occur
    # exactly once in its file, or the mutant is updated to plant the same bug again.
    import runpy

    root = Path(__file__).resolve().parent.parent
    mutants = runpy.run_path(str(root / "scripts" / "mutants"), run_name="mutants")["MUTANTS"]
    stale = []
    for mutant in mutants:
        text = (root / mutant.file).read_text()
        stale += [f"{mutant.name}: found {text.count(original)} times in {mutant.file}"
                  for original, _ in mutant.edits if text.count(original) != 1]
    assert not stale, "\n".join(stale)
