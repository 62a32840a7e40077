#!/usr/bin/env python3
"""Make a copy of handrail's `src/` without the SQLite audit chain, for measuring its cost only.

    git -C /work/main archive main src | tar -x -C /tmp/nochain
    scripts/audit_nochain_patch.py /tmp/nochain/src
    benchmarks/instructions.py --cases floor_sqlite,handrail_sqlite --against /tmp/nochain/src

Never for use: a store written by the copy has no chain, and verifies as broken. The copy is
the same code with the chain's work taken out of a durable SQLite call (issue 42, "cost per
durable call"): no fact bodies built for call records (the marshal of the row), `_chain`
returns the call records' log rows bare (no hash, no fact columns, no rows of other facts),
the log without the fact columns, no `audit` tables at schema creation and nothing copied
into them at the fold, no data version read. Each edit names the exact text it replaces and
fails loudly when that text is gone (the code moved on: update the edit).

Works on a tree with the chain in version 2 (`_LOG_WIDTH = 29`: `V2`) or in version 3
(`_LOG_WIDTH = 28`: `V3`), whichever the tree holds.
"""

# ruff: noqa: T201 - a command-line script

from __future__ import annotations

import re
import sys
from pathlib import Path

SQLITE = "handrail/store/_sqlite.py"

COMMON: list[tuple[str, str]] = [
    # The data version (a ctypes call a transaction) is read only for the chain's cache.
    ("self._tips = _Tips(None if memory else _data_version)", "self._tips = _Tips(None)"),
]

_BARE = (
    "    rows = [f[4] for f in facts if f[4] is not None]\n"
    "    if rows and insert:\n        _insert_log(db, (), rows)\n    return rows\n")
"""What `_chain` does without the chain: the call records' log rows, as they are."""

V2: list[tuple[str, str]] = [
    # The audit tables are not created with a new file's schema.
    ('    """ + _AUDIT_TABLES + """;\n', ""),
    ('                facts += [(c[1], "call", c[2], _MARSHAL((2, "call", c[2:]), 2), c)',
     '                facts += [(c[1], "call", c[2], b"", c)'),
    ("_LOG_WIDTH = 29\n", "_LOG_WIDTH = 23\n"),
    ("        for statement in _FOLD_BEFORE_0012 if old else _FOLD:\n",
     "        for statement in _FOLD:\n"),
    ('"WHERE kind = 2 AND id <= :upto ORDER BY id"), _FOLD[3])',
     '"WHERE kind = 2 AND id <= :upto ORDER BY id"), _FOLD[2])'),
    ('    "INSERT INTO audit SELECT c23, run_id, c24, CASE kind WHEN 1 THEN \'call\' '
     'ELSE c0 END, "\n    "CASE kind WHEN 1 THEN c0 ELSE c1 END, CASE kind WHEN 1 THEN NULL '
     'ELSE c2 END, c25, c26, "\n    "c27, c28 FROM log WHERE c23 IS NOT NULL AND id <= :upto '
     'ORDER BY id",\n', ""),
    ("    seq, link = tips.catch_up(db)\n", _BARE + "    seq, link = tips.catch_up(db)\n"),
]
"""The chain as issue 42's fourth round left it (version 2: main before this branch)."""

V3: list[tuple[str, str]] = [
    ('    """ + _AUDIT_TABLE + """;\n', ""),
    ('                facts += [(c[1], "call", c[2], _MARSHAL((3, "call", c[2:]), 2), c)',
     '                facts += [(c[1], "call", c[2], b"", c)'),
    ("_LOG_WIDTH = 28\n", "_LOG_WIDTH = 23\n"),
    ("        for statement in _fold_statements(db):\n",
     "        for statement in (_FOLD[0], _FOLD[1], _FOLD[3]):\n"),
    ("        db.execute(_AUDIT_INDEX)  # (the first fold's facts make it)\n", ""),
    ("    seq, link = tips.catch_up(db)\n", _BARE + "    seq, link = tips.catch_up(db)\n"),
]
"""Version 3 (migration 0013_raw_hashes: a fact's hash and link raw, five log columns)."""


def patch(src: Path) -> None:
    """Apply the edits to `src` (a copy of handrail's `src/`), in place."""
    path = src / SQLITE
    text = path.read_text()
    edits = COMMON + (V3 if "_LOG_WIDTH = 28\n" in text else V2)
    for original, replacement in edits:
        if text.count(original) != 1:
            raise SystemExit(f"{path}: expected exactly one {original!r} "
                             f"(found {text.count(original)}): update this script")
        text = text.replace(original, replacement)
    compile(text, str(path), "exec")
    path.write_text(text)
    print(f"patched {path}: no audit chain ({len(edits)} edits)")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / SQLITE).is_file():
        raise SystemExit(re.sub(r"\n    ", "\n", __doc__ or "").split("\n\n")[0])
    patch(Path(sys.argv[1]))
