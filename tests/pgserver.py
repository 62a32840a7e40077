"""A real, throwaway PostgreSQL server for the tests and benchmarks.

`start()` finds the server binaries (`pg_config --bindir`, else Debian's versioned folder),
makes a cluster in a fresh temporary folder owned by the unprivileged `postgres` user (the
server refuses to run as root; the tests run as root on CI), and starts it on a unix socket in
that folder only (no TCP). `stop()` stops it and removes the folder. `unavailable()` says why
a server cannot be started here, or None.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path


def bindir() -> Path | None:
    """The folder holding initdb and pg_ctl, or None."""
    candidates: list[str] = []
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        if out.returncode == 0:
            candidates.append(out.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for folder in candidates:
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


def _as_postgres() -> list[str]:
    """The prefix that runs a command as the server's user (root cannot run the server)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--"]
    return ["sudo", "-u", "postgres"]


def unavailable() -> str | None:
    """Why a server cannot be started here, or None."""
    if bindir() is None:
        return ("PostgreSQL server binaries (initdb, pg_ctl) not found: install the "
                "`postgresql` package (scripts/test does so with apt-get where it can)")
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` user to run the server as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[dev]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running server: its folder, socket folder and port."""

    root: Path
    port: int
    bindir: Path

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    def url(self, dbname: str = "postgres") -> str:
        """A libpq URL for `dbname` over the unix socket."""
        return f"postgresql://postgres@/{dbname}?host={self.socket_dir}&port={self.port}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}".encode())
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop a database `create_database` made, closing what is still connected to it."""
        import psycopg

        name = url.partition("?")[0].rpartition("/")[2]
        if not name.startswith("t_") or not name[2:].isalnum():
            raise ValueError(f"not a database of create_database(): {url}")
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)".encode())


def start(*, durable: bool = False) -> Server:
    """Start a server in a new temporary folder.

    Args:
        durable: Keep PostgreSQL's fsync (benchmarks); tests turn it off (they kill clients,
            never the server, so the server's own crash safety is not what they test).
    """
    found = bindir()
    if found is None:
        raise RuntimeError(unavailable() or "no PostgreSQL")
    root = Path(tempfile.mkdtemp(prefix="handrail-pg-"))
    (root / "sock").mkdir()
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(root / "sock", "postgres", "postgres")
    run = _as_postgres()
    subprocess.run([*run, str(found / "initdb"), "-D", str(root / "data"), "-U", "postgres",
                    "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"],
                   check=True, capture_output=True)
    port = _free_port()
    options = (f"-c listen_addresses='' -c unix_socket_directories={root / 'sock'} "
               f"-p {port} -c max_connections=200 -c shared_buffers=64MB")
    if not durable:
        options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    subprocess.run([*run, str(found / "pg_ctl"), "-D", str(root / "data"), "-w", "-t", "60",
                    "-o", options, "-l", str(root / "server.log"), "start"],
                   check=True, capture_output=True)
    return Server(root=root, port=port, bindir=found)


def stop(server: Server) -> None:
    """Stop the server (fast shutdown) and remove its folder."""
    subprocess.run([*_as_postgres(), str(server.bindir / "pg_ctl"), "-D",
                    str(server.root / "data"), "-m", "immediate", "-w", "stop"],
                   capture_output=True)
    shutil.rmtree(server.root, ignore_errors=True)
