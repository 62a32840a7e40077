"""docs/observability.md runs as written, in a fresh process.

Its first block installs a global tracer provider (the way most programs turn tracing on);
in this process that would make every later test's runs report to the console.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RUN = """
import sys
sys.path.insert(0, {tests!r})
import test_docs_examples
test_docs_examples._run_page("docs/observability.md")
print("ALL BLOCKS RAN")
"""


def test_every_block_of_observability_md_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _RUN.format(tests=str(ROOT / "tests"))],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.rstrip().endswith("ALL BLOCKS RAN")
    # The console exporter printed the run's spans, the gate's verdict among them.
    for name in ('"name": "invoke_agent adder"', '"name": "chat scripted"',
                 '"name": "execute_tool local/add"', '"handrail.verdict": "allow"'):
        assert name in out, name
