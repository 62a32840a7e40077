"""An EXEC check memoises the spellings of a short argv, never of a long one (a model chooses
the argv: 1,024 long ones kept would pin a gigabyte)."""

from __future__ import annotations

from pathlib import Path

import handrail as hr
from handrail.policy import _targets


def test_a_short_argv_is_memoised_and_a_long_one_is_not(tmp_path: Path) -> None:
    policy = hr.Policy.default()
    memo = _targets._exec_memo
    memo.clear()
    short = hr.Action(hr.Act.EXEC, ("git", "status"))
    first = policy.check(short, workspace=tmp_path)
    again = policy.check(short, workspace=tmp_path)
    assert first == again
    root = str(tmp_path.resolve())
    assert list(memo) == [(("git", "status"), root)]
    long = hr.Action(hr.Act.EXEC, ("echo", "x" * (_targets._MEMO_ARGV + 1)))
    policy.check(long, workspace=tmp_path)
    policy.check(long, workspace=tmp_path)
    assert len(memo) == 1  # only the short argv is kept
    # Memoised or not, the candidates are the same.
    program = _targets.resolve_program("git", root)
    assert memo[("git", "status"), root] == (
        program,
        _targets.exec_candidates(("git", "status"), program, root),
    )
