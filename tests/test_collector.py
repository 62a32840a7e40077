"""The collector setting for many runs on one loop: what it sets, and where handrail applies it.

It is process-wide, so every check runs in a fresh interpreter: the test session's own
collector stays as it comes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from handrail.cli import build_parser


def _probe(code: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    state: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return state


STATE = "json.dumps({'threshold': gc.get_threshold(), 'frozen': gc.get_freeze_count()})"


def test_tuning_freezes_start_up_and_makes_full_passes_rarer() -> None:
    state = _probe(f"""
        import gc, json
        import handrail
        from handrail.collector import FULL_PASS_EVERY, tune_for_many_runs
        young, middle, _ = gc.get_threshold()
        tune_for_many_runs()
        state = json.loads({STATE})
        state['expected'] = [young, middle, FULL_PASS_EVERY]
        print(json.dumps(state))
    """)
    assert state["threshold"] == state["expected"]
    assert state["frozen"] > 1000  # the imports


@pytest.mark.parametrize("command", ["serve", "worker", "inbox"])
def test_the_servers_are_marked_as_processes_of_many_runs(command: str) -> None:
    args = build_parser().parse_args([command])
    assert args.many_runs is True
    assert getattr(build_parser().parse_args(["runs"]), "many_runs", False) is False


def test_the_cli_tunes_only_a_process_it_was_started_as() -> None:
    # `handrail worker` as a program (argv from sys.argv) is tuned; `main([...])` called by
    # another program, or a reading command, leaves the collector alone.
    code = f"""
        import gc, json, sys
        import handrail.cli._worker as worker
        from handrail import cli
        def probe(args):
            print({STATE})
            return 0
        worker._cmd_worker = probe
        MODE
    """
    as_program = _probe(code.replace("MODE", "sys.argv = ['handrail', 'worker']; cli.main()"))
    assert as_program["threshold"][2] != 10 and as_program["frozen"] > 0
    called = _probe(code.replace("MODE", "cli.main(['worker'])"))
    assert called["threshold"][2] == 10 and called["frozen"] == 0
