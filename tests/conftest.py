"""Shared fixtures and the suite's own checks.

- `anyio_backend`: async tests run on asyncio (anyio's pytest plugin).
- `pg_server` starts one PostgreSQL server per test session — per xdist worker when the suite
  runs in parallel — (tests/pgserver.py) and removes it at the end; `pg_url` is a fresh empty
  database on it for one test, dropped after it. Where no server can be started (no binaries
  and no way to install them), PostgreSQL tests are skipped with the reason.
- No test may leave a process running: every process the suite starts carries a marker in its
  environment (`HANDRAIL_TEST_PROCESS`, one value per session or xdist worker); at the end of
  the session any process still alive with that marker, or still a child of this one, fails
  the session, named with its command line and the test that was running when it started —
  and is killed.
- `HANDRAIL_TEST_SRC` (set by scripts/mutants): the source tree under test. It must be the one
  this process imports, and every process a test starts gets it first on its PYTHONPATH —
  also a test that builds a PYTHONPATH of its own — so a bug planted in code that runs in a
  subprocess (the worker, the CLI, MCP servers) is seen by the tests that start it.
"""

from __future__ import annotations

import bisect
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import pgserver

# Hypothesis, on a loaded machine (a shared CI host, other suites beside this one): generating
# inputs slowly is the machine's doing, not the test's; no per-example deadline either (the
# per-test timeout catches a hang). Tests that set their own settings keep them.
settings.register_profile("handrail", suppress_health_check=[HealthCheck.too_slow],
                          deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "handrail"))

# ------------------------------------------------------------------ the source tree under test

TEST_SRC = "HANDRAIL_TEST_SRC"
_popen_init = subprocess.Popen.__init__


def _child_env(env: Any) -> Any:
    """`env` for a child process, with $HANDRAIL_TEST_SRC first on its PYTHONPATH."""
    src = os.environ.get(TEST_SRC)
    if not src:
        return env
    env = dict(os.environ if env is None else env)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([src, *(p for p in parts if p != src)])
    env[TEST_SRC] = src
    return env


def _popen_with_test_src(self: Any, *args: Any, env: Any = None, **kwargs: Any) -> None:
    _popen_init(self, *args, env=_child_env(env), **kwargs)


# Every way a test starts a process (subprocess, asyncio's and anyio's processes, the MCP SDK's
# stdio client) goes through Popen. Read at each call: without the variable, nothing changes.
subprocess.Popen.__init__ = _popen_with_test_src  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    src = os.environ.get(TEST_SRC)
    if src:
        import handrail

        if not Path(handrail.__file__).resolve().is_relative_to(Path(src).resolve()):
            raise pytest.UsageError(f"${TEST_SRC} is {src}, but the tests import handrail from "
                                    f"{handrail.__file__}: put {src} first on PYTHONPATH")


# ------------------------------------------------------------------ the order of the files

# scripts/test runs the suite with `--dist loadfile --no-loadscope-reorder`: a file is one unit
# of work (its module fixtures, a browser or a server, start once), and a free worker takes the
# next file in collection order. The longest files go first: one taken last runs on alone at
# the end while the other workers sit idle (longest first; the short files then even out the
# ends). Seconds per file, from its tests' `--durations` in a whole-suite run (3 workers, load
# ~4; the tests under 4 s, not listed there, estimated; then less for the files issue 35 made
# cheaper): only the order they give matters; a file not listed keeps its place after these.
FILE_SECONDS = {
    "tests/cli/test_worker.py": 125,
    "tests/doors/test_doors.py": 110,
    "tests/runs/test_kill.py": 100,
    "tests/mcp/test_mcp_http_sessions.py": 95,
    "tests/mcp/test_mcp_inspector.py": 74,
    "tests/web/test_inbox_browser.py": 70,
    "tests/mcp/test_mcp_client.py": 70,
    "tests/cli/test_cli_hints.py": 50,
    "tests/policy/test_quota_race.py": 45,
    "tests/mcp/test_mcp_list_changed.py": 45,
    "tests/runs/test_verify.py": 40,
    "tests/policy/test_whatif.py": 40,
    "tests/cli/test_cli_truthful.py": 40,
    "tests/mcp/test_mcp_http.py": 38,
    "tests/policy/test_policy_matching.py": 35,
    "tests/otel/test_spans.py": 30,
    "tests/mcp/test_mcp_carry.py": 30,
    "tests/manifest/test_manifest_digest.py": 28,
    "tests/mcp/test_mcp_docs.py": 27,
    "tests/mcp/test_mcp_npm.py": 25,
    "tests/runs/test_promises.py": 25,
    "tests/mcp/test_mcp_serve.py": 22,
    "tests/manifest/test_manifest_cli.py": 22,
    "tests/runs/test_output_type.py": 22,
    "tests/mcp/test_serve_hardening.py": 20,
    "tests/mcp/test_mcp_scaffold.py": 20,
    "tests/cli/test_cli_runs.py": 18,
    "tests/cli/test_cli_polish.py": 18,
    "tests/policy/test_real_path.py": 15,
    "tests/tools/test_watched.py": 12,
    "tests/mcp/test_mcp_check.py": 15,
    "tests/mcp/test_mcp_git.py": 15,
    "tests/mcp/test_mcp_stdio.py": 15,
    "tests/runs/test_kill_batched.py": 14,
    "tests/sandbox/test_descendants.py": 12,
    "tests/subagents/test_tree_process.py": 12,
}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist (scripts/test), the longest files first; each file's tests kept together,
    in their order. Every worker collects the same order, as xdist requires."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.partition("::")[0], i)

    def key(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.partition("::")[0]
        return -FILE_SECONDS.get(path, 0), first[path]

    items.sort(key=key)


# ------------------------------------------------------------------ leftover processes

MARK = "HANDRAIL_TEST_PROCESS"
# Set at import, in every process that runs tests (each xdist worker overwrites the value it
# inherited from the controller): every process started from here on inherits it.
os.environ[MARK] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
_TICK = os.sysconf("SC_CLK_TCK")
_tests: list[tuple[float, str]] = []
"""(boot-clock seconds at its start, node id) of every test run in this process, in order."""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _tests.append((time.clock_gettime(time.CLOCK_BOOTTIME), item.nodeid))


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(state, parent pid, start in boot-clock seconds) of a process, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    return fields[0], int(fields[1]), int(fields[19]) / _TICK


def _leftovers() -> dict[int, str]:
    """Processes this session started and left: pid -> what it is.

    Running ones marked with this session's value, or children of this process; and children
    that exited but were never waited for (a `Popen` without `wait()`: a zombie here, and a
    ResourceWarning in whichever later test the collector happens to free it).
    """
    me = os.getpid()
    mark = f"{MARK}={os.environ[MARK]}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        stat = _stat(pid)
        if stat is None or stat[0] == "X":
            continue
        if stat[0] == "Z":
            if stat[1] == me:
                comm = Path(f"/proc/{pid}/comm").read_text().strip() if Path(
                    f"/proc/{pid}/comm").exists() else "?"
                found[pid] = f"{comm} (exited, never waited for)"
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            environ = cmdline = b""
        if stat[1] == me or mark in environ.split(b"\0"):
            found[pid] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def _started_during(pid: int) -> str:
    stat = _stat(pid)
    if stat is None or not _tests:
        return "?"
    # The kernel counts in ticks (1/100 s), rounded down: the latest test begun by the end of
    # that tick (tests a tick apart cannot be told apart).
    at = bisect.bisect_right([t for t, _ in _tests], stat[2] + 1 / _TICK) - 1
    return _tests[at][1] if at >= 0 else "before the first test"


@pytest.fixture(scope="session", autouse=True)
def _no_process_left_running() -> Iterator[None]:
    """Fails the session when a process a test started is still running at its end."""
    yield
    # Set up before every other fixture, so torn down after them all (servers included).
    # A process being stopped may take a moment to go: waited for, then named and killed.
    deadline = time.monotonic() + float(os.environ.get("HANDRAIL_TEST_LEFTOVER_WAIT", "15"))
    left = _leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _leftovers()
    if not left:
        return
    lines = [f"  pid {pid}: {cmd[:200]!r}, started during {_started_during(pid)}"
             for pid, cmd in sorted(left.items())]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in left:
        try:
            os.waitpid(pid, 0)  # ours: reaped, or it would stay a zombie
        except OSError:
            pass
    pytest.fail("processes left by the tests (now killed and reaped): stop and wait for every "
                "process a test starts, in a finally or a fixture's teardown\n"
                + "\n".join(lines), pytrace=False)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session", autouse=True)
def _shared_fork_server() -> Iterator[None]:
    """Stops the fork server tests start their programs from (tests/tools/forks.py), if one
    was started (before the check for processes left running: set up after it)."""
    yield
    forks = sys.modules.get("forks")  # imported by the tests that use it, if any ran here
    if forks is not None:
        forks.stop_shared()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pgserver.Server]:
    reason = pgserver.unavailable()
    if reason is not None:
        pytest.skip(f"PostgreSQL tests skipped: {reason}")
    server = pgserver.start()
    try:
        yield server
    finally:
        pgserver.stop(server)


@pytest.fixture
def pg_url(pg_server: pgserver.Server) -> Iterator[str]:
    url = pg_server.create_database()
    yield url
    # Dropped (its connections closed): the cluster stays small, so stopping and removing it
    # at the end is quick even after a thousand tests.
    pg_server.drop_database(url)
