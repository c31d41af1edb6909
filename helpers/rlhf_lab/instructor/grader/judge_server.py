"""The judge server: one judge for a whole class run, so the references compile once per run.

Every student's ``nbgrader autograde`` is a new process. Judging in that process (:mod:`.judge`)
imports the course library and compiles the jitted reference computations again for every
student. A :class:`JudgeServer` keeps them in one long-lived process instead:

* it listens on a Unix socket (``multiprocessing.connection``, whose messages are read with
  ``recv_bytes`` and a size limit and decoded as JSON of plain data, :func:`.judge.link_recv`: never
  unpickled) in a private folder created with
  ``tempfile.mkdtemp`` (mode 0700, in the grader's ``/tmp``, outside every student folder; a
  sandboxed kernel has its own ``/tmp`` and cannot see it; when nbgrader runs as the course
  owner's account, the folder becomes 0711 and the socket that account's, :meth:`JudgeServer.grant`),
  and accepts only clients that know its random 32-byte key (the standard HMAC challenge of ``multiprocessing.connection``);
* its address and key reach the per-student nbgrader processes through their environment
  (:meth:`JudgeServer.env`, passed by :func:`.orchestrator.grade_submission`); the sandbox gives
  the kernel a clean environment, and :mod:`.judge` removes both variables from the nbgrader
  process's own environment when it is loaded;
* for each judged cell the nbgrader process sends the grade id; the server runs
  :func:`.judge.run_check` (a fresh secret seed drawn here) with a :class:`ProxyStudent`, whose
  every request goes back over the same connection to the nbgrader process, which forwards it to
  the kernel and returns plain data; the server then returns the verdict (see
  :class:`.judge.ServerLink` for the messages).

The executors own the server's lifetime: :func:`shared` starts one per process when a task first
asks for it (the sequential executor's process; each Dask worker once), :func:`stop_shared` stops it
at the end of the run (a thread of that process serves it; nothing outlives the run). A grader
process that cannot use the server judges in its own process, so no grade depends on it.

Layer: instructor, low (imports :mod:`.judge` and :mod:`rlhf_lab.judging`).
"""
from __future__ import annotations

import atexit
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Listener, answer_challenge, deliver_challenge

from . import judge

log = logging.getLogger(__name__)


class _Aborted(BaseException):
    """The grader process gave up a request (for example the kernel is gone): stop the check.

    A ``BaseException`` so that no check's own ``except Exception`` can swallow it."""


class _LinkLost(BaseException):
    """The grader process went away in the middle of a check."""


class ProxyStudent:
    """A :class:`rlhf_lab.judging.core.Student` whose requests are answered by the grader process.

    Each call sends ``("ask", method, args, kwargs)`` over ``conn`` and waits for the answer: the
    plain value, a ``GradingError`` message (raised here, so the check decides as it would
    in the grader process) or an abort (the check stops; the grader process raises its own error).
    """

    def __init__(self, conn):
        self._conn = conn
        from rlhf_lab.judging import core, wire

        self._core, self._wire = core, wire

    def _ask(self, method: str, args: tuple, kwargs: dict):
        data = judge.link_encode(("ask", method, args, kwargs))  # not plain data: the check's own failure
        try:
            self._conn.send_bytes(data)
            answer = judge.link_recv(self._conn)
        except (OSError, EOFError, ValueError, self._wire.Refused):  # lost, or not a message of ours
            raise _LinkLost() from None
        kind = answer[0]
        if kind == "ok" and len(answer) == 2:
            return answer[1]
        if kind == "fail" and len(answer) == 2:
            raise self._core.GradingError(str(answer[1]))
        raise _Aborted()

    def call(self, name: str, *args, **kwargs):
        return self._ask("call", (name, *args), kwargs)

    def grad(self, name: str, argnums, *args, **kwargs):
        return self._ask("grad", (name, argnums, *args), kwargs)

    def value(self, name: str):
        return self._ask("value", (name,), {})

    def scenario(self, source, needs, *args, **kwargs):
        return self._ask("scenario", (source, needs, *args), kwargs)


class JudgeServer:
    """A judge on a Unix socket, served by threads of this process (see the module docstring).

    ``warm`` imports the course library and builds the references in the background as soon as
    the server starts (while the first student's nbgrader process starts up). ``served`` counts the
    checks decided here, ``failed_handshakes`` the clients refused.
    """

    def __init__(self, warm: bool = True):
        self.directory = tempfile.mkdtemp(prefix="rlhf-judge-")  # mode 0700
        os.chmod(self.directory, 0o700)
        self.address = os.path.join(self.directory, "judge.sock")
        self.authkey = secrets.token_bytes(32)
        self.pid = os.getpid()
        self.served = 0
        self.failed_handshakes = 0
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        # no authkey here: the challenge runs in each connection's own thread, so a client that
        # never answers it cannot hold up the others
        self._listener = Listener(self.address, family="AF_UNIX", backlog=16)
        self._thread = threading.Thread(target=self._accept_loop, name="rlhf-judge-server", daemon=True)
        self._thread.start()
        if warm:
            threading.Thread(target=self._warm, name="rlhf-judge-warm", daemon=True).start()

    def grant(self, uid: int) -> None:
        """Let ``uid`` connect (an nbgrader process run as that account): the socket becomes that
        account's (connecting needs write access to it: no other account has it); the folder stays
        this process's, searchable but not listable or writable by others (0711), so nothing in it
        can be renamed or replaced."""
        os.chmod(self.directory, 0o711)
        os.chown(self.address, uid, -1, follow_symlinks=False)

    def env(self) -> dict:
        """The environment variables that point an nbgrader process at this server."""
        return {judge.ADDRESS_ENV: self.address, judge.AUTHKEY_ENV: self.authkey.hex()}

    @staticmethod
    def _warm() -> None:
        try:
            judge._reference()
        except Exception as exc:  # noqa: BLE001 - the first check will say what is wrong
            log.warning("judge server: could not build the references in advance: %s", exc)

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                conn = self._listener.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                continue
            if self._stopped.is_set():
                conn.close()
                return
            threading.Thread(target=self._serve, args=(conn,), name="rlhf-judge-conn", daemon=True).start()

    def _serve(self, conn) -> None:
        try:
            try:
                deliver_challenge(conn, self.authkey)
                answer_challenge(conn, self.authkey)
            except (AuthenticationError, OSError, EOFError, ValueError):
                with self._lock:
                    self.failed_handshakes += 1
                return
            while not self._stopped.is_set():
                try:
                    message = judge.link_recv(conn)  # bounded, and plain data only (no unpickling)
                except (OSError, EOFError):
                    return
                except Exception:  # noqa: BLE001 - not a message of ours
                    return
                if not (isinstance(message, tuple) and len(message) == 3 and message[0] == "judge"
                        and message[1] == judge.PROTOCOL and isinstance(message[2], str)):
                    return  # closing tells the grader process to judge by itself
                try:
                    reply = self._decide(conn, message[2])
                except _LinkLost:
                    return
                try:
                    judge.link_send(conn, reply)
                except (OSError, ValueError):
                    return
        finally:
            conn.close()

    def _decide(self, conn, name: str) -> tuple:
        try:
            outputs = judge.run_check(name, ProxyStudent(conn))
        except _Aborted:
            return ("aborted",)
        except Exception as exc:  # noqa: BLE001 - reported to the grader process as its failure
            return ("crashed", type(exc).__name__, str(exc)[:4000])
        finally:
            with self._lock:
                self.served += 1
        return ("verdict", outputs[0]["evalue"] if outputs else None)

    def close(self) -> None:
        """Stop accepting, let the serving threads end, remove the socket's folder."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:  # wake the accept loop
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
                wake.settimeout(1.0)
                wake.connect(self.address)
        except OSError:
            pass
        self._thread.join(timeout=5)
        try:
            self._listener.close()
        except OSError:
            pass
        shutil.rmtree(self.directory, ignore_errors=True)

    def stats(self) -> dict:
        return {"served": self.served, "failed_handshakes": self.failed_handshakes, "pid": self.pid}


# ----------------------------------------------------------------------------- one per process
_SHARED: list = []
_SHARED_LOCK = threading.Lock()
#: The statistics of the last server :func:`stop_shared` stopped in this process.
LAST: dict = {}


def shared() -> JudgeServer:
    """This process's judge server, started on first use (a forked child starts its own)."""
    with _SHARED_LOCK:
        if _SHARED and _SHARED[0].pid != os.getpid():
            _SHARED.clear()
        if not _SHARED:
            _SHARED.append(JudgeServer())
        return _SHARED[0]


def child_env() -> dict:
    """The environment entries of this process's judge server for an nbgrader process (started on
    first use); ``{}`` when no server can be started (that process then judges by itself)."""
    try:
        return shared().env()
    except OSError as exc:
        log.warning("judge server could not start (%s): each student's process judges by itself", exc)
        return {}


def grant_shared(uid: int) -> None:
    """Let the account ``uid`` (the one nbgrader runs as) reach this process's judge server: its
    socket, created here by this process (never a course or student path), is given to that
    account (:meth:`JudgeServer.grant`); the key still decides who is served. Nothing without a server."""
    with _SHARED_LOCK:
        server = _SHARED[0] if _SHARED and _SHARED[0].pid == os.getpid() else None
    if server is not None:
        server.grant(uid)


def stop_shared() -> dict:
    """Stop this process's judge server, if any; its statistics (also kept in :data:`LAST`)."""
    with _SHARED_LOCK:
        server = _SHARED.pop() if _SHARED and _SHARED[0].pid == os.getpid() else None
        _SHARED.clear()
    if server is None:
        return {}
    server.close()
    LAST.clear()
    LAST.update(server.stats())
    return dict(LAST)


def enabled(environ=None) -> bool:
    """False only with ``RLHF_JUDGE_SERVER=0`` (each student's process judges by itself, as bare
    ``nbgrader autograde`` does: the benchmark's baseline)."""
    environ = os.environ if environ is None else environ
    return environ.get("RLHF_JUDGE_SERVER", "1") != "0"


atexit.register(stop_shared)
