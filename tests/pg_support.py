"""A throwaway PostgreSQL server for tests: ``initdb`` into a temp folder, 127.0.0.1, a random port.

Usage::

    from pg_support import postgres_server, create_database

    with postgres_server() as server:          # starts, yields, always stops and deletes
        url = create_database(server, "grades")  # postgresql://grader@127.0.0.1:PORT/grades

or the session fixture ``postgres`` in ``conftest``-style modules (``pytest_plugins``/import).

PostgreSQL refuses to run as root: when the tests run as root, the server runs as the
unprivileged ``postgres`` account (``nobody`` when there is none) through ``runuser``, and the
temporary folder is handed to that account. The binaries come from PATH or
``/usr/lib/postgresql/<version>/bin`` (Debian's ``postgresql`` package, which ``.ci/run``
installs when missing).
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

SUPERUSER = "grader"


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server binaries are not installed."""


def find_bindir() -> Path:
    """Folder holding ``initdb``, ``pg_ctl`` and ``postgres`` (PATH first, then Debian's layout)."""
    initdb = shutil.which("initdb")
    if initdb:
        real = Path(os.path.realpath(initdb)).parent
        if (real / "pg_ctl").exists() and (real / "postgres").exists():
            return real
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: [int(x) if x.isdigit() else x for x in Path(p).parts[-3].split(".")])
    if candidates:
        return Path(candidates[-1]).parent
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in "
        "/usr/lib/postgresql/*/bin: install Debian's 'postgresql' package (.ci/run does)")


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> str | None:
    """The unprivileged account to run the server as when we are root (else None: ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise PostgresUnavailable("running as root and no unprivileged account (postgres/nobody) exists")


@dataclasses.dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    user: str
    socket_dir: str
    data_dir: str
    log_file: str

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}"


def _cmd(user: str | None, args: list[str]) -> list[str]:
    return (["runuser", "-u", user, "--"] + args) if user else args


@contextlib.contextmanager
def postgres_server(start_timeout: float = 60.0) -> Iterator[PostgresServer]:
    """Start a private PostgreSQL server on 127.0.0.1 and a random free port; always stop it."""
    bindir = find_bindir()
    user = _run_as()
    base = tempfile.mkdtemp(prefix="rlhf-pg-")
    data_dir = os.path.join(base, "data")
    socket_dir = os.path.join(base, "sock")
    log_file = os.path.join(base, "server.log")
    os.makedirs(socket_dir)
    if user:
        pw = pwd.getpwnam(user)
        for path in (base, socket_dir):
            os.chown(path, pw.pw_uid, pw.pw_gid)
        os.chmod(base, 0o700)
    env = dict(os.environ, LC_ALL="C", LANG="C")
    started = False
    try:
        subprocess.run(_cmd(user, [str(bindir / "initdb"), "-D", data_dir, "-U", SUPERUSER,
                                   "--auth=trust", "--encoding=UTF8", "--no-sync"]),
                       check=True, capture_output=True, text=True, env=env, cwd=base)
        for attempt in range(5):  # the random port can be taken between choosing and binding
            port = free_port()
            opts = (f"-p {port} -k {socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                    "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
            proc = subprocess.run(
                _cmd(user, [str(bindir / "pg_ctl"), "-D", data_dir, "-l", log_file, "-o", opts,
                            "-w", "-t", str(int(start_timeout)), "start"]),
                capture_output=True, text=True, env=env, cwd=base)
            if proc.returncode == 0:
                started = True
                break
            time.sleep(0.2)
        if not started:
            log = Path(log_file).read_text() if os.path.exists(log_file) else ""
            raise RuntimeError(f"PostgreSQL did not start:\n{proc.stdout}{proc.stderr}\n{log[-3000:]}")
        yield PostgresServer("127.0.0.1", port, SUPERUSER, socket_dir, data_dir, log_file)
    finally:
        if started:
            subprocess.run(_cmd(user, [str(bindir / "pg_ctl"), "-D", data_dir, "-m", "immediate",
                                       "-w", "stop"]), capture_output=True, env=env, cwd=base)
        shutil.rmtree(base, ignore_errors=True)


def create_database(server: PostgresServer, name: str) -> str:
    """``CREATE DATABASE name`` on the server; returns its URL."""
    import psycopg2

    con = psycopg2.connect(host=server.host, port=server.port, user=server.user, dbname="postgres")
    try:
        con.autocommit = True
        with con.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        con.close()
    return server.url(name)
