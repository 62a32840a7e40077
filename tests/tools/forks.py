"""`Forks`: run test programs as forks of one process that has imported handrail already.

A Python process that imports handrail spends ~0.5 s of CPU on it before doing anything; a
test module that starts a hundred of them (the kill tests) pays that a hundred times. A
`Forks` starts `fork_server.py` once, with the modules to import; `run` forks a child of it
per program, which runs the script as `__main__` (see fork_server.py). A child is a process of
its own, killed and reaped like any: only the imports are shared.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

SERVER = Path(__file__).with_name("fork_server.py")


class Forks:
    """A fork server (a context manager: it is stopped and reaped on exit)."""

    def __init__(self, modules: list[str]) -> None:
        # Started with Popen: tests/conftest.py's marker and $HANDRAIL_TEST_SRC reach it (and
        # so every fork), as they reach any process a test starts.
        self.proc = subprocess.Popen([sys.executable, str(SERVER), *modules],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.runs = 0
        self._buffer = b""
        self.dir = Path(tempfile.mkdtemp(prefix="handrail-forks-"))

    def __enter__(self) -> Forks:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _answer(self, timeout: float) -> dict[str, Any] | None:
        """The server's next answer line, or None if none came within `timeout`."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            assert chunk, "fork_server.py ended"
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return dict(json.loads(line))

    def run(self, script: Path, argv: list[str], env: dict[str, str], tmp: Path,
            timeout: float = 60) -> tuple[int, str, str]:
        """Run `script` with `argv` in a fork, in this process's working directory, with its
        environment and `env` (as `subprocess.run(env={**os.environ, **env})` would):
        (returncode as Popen gives it, stdout, stderr). Its output goes through files in
        `tmp`."""
        return self._run({"script": str(script), "argv": argv, "env": {**os.environ, **env},
                          "replace_env": True, "cwd": os.getcwd()}, tmp, timeout)

    def run_module(self, module: str, argv: list[str], *, env: dict[str, str], cwd: Path,
                   timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`python -m module *argv` in a fork, in `cwd`, with exactly `env` as its
        environment, stdin at /dev/null: as `subprocess.run(..., capture_output=True,
        text=True)` would return it (its output goes through files of the server's own)."""
        request = {"module": module, "argv": argv, "env": env, "replace_env": True,
                   "cwd": str(cwd)}
        code, out, err = self._run(request, self.dir, timeout)
        return subprocess.CompletedProcess([sys.executable, "-m", module, *argv], code, out,
                                           err)

    def run_code(self, code: str, argv: list[str], *, env: dict[str, str], cwd: Path,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`python -c code *argv` in a fork, as `run_module` runs a module."""
        request = {"code": code, "argv": argv, "env": env, "replace_env": True, "cwd": str(cwd)}
        returncode, out, err = self._run(request, self.dir, timeout)
        return subprocess.CompletedProcess([sys.executable, "-c", code, *argv], returncode,
                                           out, err)

    def _run(self, request: dict[str, Any], tmp: Path, timeout: float) -> tuple[int, str, str]:
        assert self.proc.stdin is not None
        self.runs += 1
        out, err = tmp / f"fork-{self.runs}.out", tmp / f"fork-{self.runs}.err"
        what = f"{request.get('module') or Path(request.get('script') or '-c').name} " \
               f"{request['argv']}"
        request = {**request, "out": str(out), "err": str(err)}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        started = self._answer(timeout)
        assert started is not None, "fork_server.py did not answer"
        ended = self._answer(timeout)
        if ended is None:  # a hang: killed (the server reaps it and answers), then failed
            os.kill(started["pid"], signal.SIGKILL)
            self._answer(timeout)
            raise AssertionError(f"{what} did not end within {timeout} s")
        return int(ended["code"]), out.read_text(), err.read_text()

    def close(self) -> None:
        """Stop the server (its stdin closed) and reap it."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            shutil.rmtree(self.dir, ignore_errors=True)


PRELOAD = ["handrail", "handrail.models", "handrail.store._sqlite", "handrail.store._postgres",
           "handrail.cli._main"]
"""What the shared server imports: what the scripts of tests/runs and the CLI import first."""
_shared: list[Forks] = []


def shared() -> Forks:
    """The process's shared fork server, started on first use (tests/conftest.py stops it at
    the end of the session)."""
    if not _shared:
        _shared.append(Forks(PRELOAD))
    return _shared[0]


def stop_shared() -> None:
    """Stop the shared server, if one was started."""
    while _shared:
        _shared.pop().close()
