"""What a program did is on the screen, and so is a program that ran unconfined.

Stories: an `exec` showed `finished 6535ms` in `handrail run`'s live view and no result at all
in `handrail show` (only text results were printed, and those with `\\n` escaped onto one
line); its exit code and the ends of its stdout and stderr were nowhere. Under
`sandbox="auto"` on a machine without bubblewrap (or with Landlock, which cannot hide `.env`
inside the workspace), the record said the program was unconfined, and neither `handrail run`
nor `handrail show` did: a user who followed the README learnt it from nowhere.

Each test runs the real `handrail run` and `handrail show` in subprocesses. "No bubblewrap" is
`$HANDRAIL_BWRAP` naming a missing file; "no Landlock either" is a `sitecustomize` that makes
the kernel's Landlock ABI read as 0 in that process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from handrail.sandbox import find_bwrap, landlock_abi

HANDRAIL = [sys.executable, "-m", "handrail.cli"]

AGENT = textwrap.dedent('''
    import handrail as hr
    from handrail.builtin import workspace_tools
    from handrail.models import Scripted, call, reply


    @hr.tool(server="notes", mutates=False)
    async def note() -> str:
        """A note of many lines, one of them hostile."""
        return "first line\\nsecond \\x1b[2Kline\\n" + "".join(f"filler {i}\\n" for i in range(500))


    SCRIPT = "printf 'out one\\\\nout two\\\\n'; printf 'bad \\\\033[31mthing\\\\n' >&2; exit 4"
    agent = hr.Agent(Scripted([call("workspace/exec", {"argv": ["sh", "-c", SCRIPT]}),
                               call("notes/note", {}), reply("done")]),
                     [*workspace_tools(), note], policy=hr.Policy.default(), workspace=".")
''')

NO_LANDLOCK = textwrap.dedent('''
    import handrail.sandbox
    import handrail.sandbox._landlock

    handrail.sandbox._landlock.abi = lambda: 0
    handrail.sandbox.landlock_abi = lambda: 0
''')


def _env(tmp_path: Path, *, bwrap: bool, landlock: bool = True) -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb"}
    for name in ("HANDRAIL_STORE", "HANDRAIL_AGENT", "FORCE_COLOR", "HANDRAIL_BWRAP"):
        env.pop(name, None)
    if not bwrap:
        env["HANDRAIL_BWRAP"] = str(tmp_path / "no-bwrap-here")
    if not landlock:
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(NO_LANDLOCK)
        env["PYTHONPATH"] = os.pathsep.join([str(site), *sys.path])
    return env


def _run_and_show(tmp_path: Path, env: dict[str, str]) -> tuple[str, str]:
    (tmp_path / "progagent.py").write_text(AGENT)
    (tmp_path / ".env").write_text("TOKEN=secret\n")
    run = subprocess.run([*HANDRAIL, "run", "progagent:agent", "work", "--approve", "all"],
                         cwd=tmp_path, env=env, capture_output=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 0, (run.stdout, run.stderr)
    (listed,) = json.loads(subprocess.run([*HANDRAIL, "runs", "--json"], cwd=tmp_path, env=env,
                                          capture_output=True, text=True, timeout=120).stdout)
    show = subprocess.run([*HANDRAIL, "show", listed["id"]], cwd=tmp_path, env=env,
                          capture_output=True, timeout=120)
    assert show.returncode == 0, show.stderr
    for raw in (run.stdout, run.stderr, show.stdout):
        assert b"\x1b" not in raw  # nothing a program wrote reaches the terminal raw
    return (run.stderr.decode() + "\n" + run.stdout.decode()), show.stdout.decode()


@pytest.mark.slow
@pytest.mark.skipif(find_bwrap()[0] is None, reason="needs a working bubblewrap")
def test_an_exec_s_exit_code_and_output_are_shown_live_and_by_show(tmp_path: Path) -> None:
    live, shown = _run_and_show(tmp_path, _env(tmp_path, bwrap=True))
    assert "exit code 4" in live
    assert "out two" in live and "bad \\x1b[31mthing" in live
    assert "UNCONFINED" not in live and "NOT enforced" not in live
    lines = shown.splitlines()
    assert any("exit code 4" in line for line in lines)
    assert "      out one" in lines and "      out two" in lines  # lines, not one escaped line
    assert "      bad \\x1b[31mthing" in lines
    assert "      first line" in lines and "      second \\x1b[2Kline" in lines
    # Bounded: 502 lines of a result are not 502 lines of a screen.
    assert any("more lines" in line for line in lines)
    assert len(lines) < 80, shown
    assert "sandbox:" not in shown
    # Times for a person, not epochs.
    assert "started: 20" in shown and " UTC (" in shown


@pytest.mark.slow
def test_without_bubblewrap_or_landlock_run_says_so_first_and_beside_the_call(tmp_path: Path
                                                                              ) -> None:
    live, shown = _run_and_show(tmp_path, _env(tmp_path, bwrap=False, landlock=False))
    first = live.index("programs run UNCONFINED here")
    assert first < live.index("workspace--exec")  # said before the first program runs
    assert "bubblewrap" in live[first:live.index("\n", first)]
    call_line = live.index("exit code 4")
    assert "UNCONFINED" in live[call_line:]  # and beside the call
    assert "apt-get install bubblewrap" in live[call_line:]
    assert any(line.strip().startswith("sandbox: UNCONFINED") for line in shown.splitlines())
    assert "apt-get install bubblewrap" in shown


@pytest.mark.slow
@pytest.mark.skipif(landlock_abi() < 1, reason="needs Landlock")
def test_landlock_denies_it_cannot_enforce_are_shown_beside_the_call(tmp_path: Path) -> None:
    live, shown = _run_and_show(tmp_path, _env(tmp_path, bwrap=False))
    assert "Landlock ABI" in live.splitlines()[0]
    assert "NOT enforced" in live and ".env" in live
    (line,) = [x for x in shown.splitlines() if x.strip().startswith("sandbox:")]
    assert "NOT enforced" in line and ".env" in line
