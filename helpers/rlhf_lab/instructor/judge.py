"""The judge: hidden tests decided in the grader's process, from outputs of the student's functions.

Autograding runs the student's notebook in a kernel (sandboxed, see :mod:`.sandbox`). Every
other cell runs there as usual; a test cell whose hidden region is ``grading.judge("<grade_id>")``
does not. Instead the grader (this process, an nbgrader ``Execute`` preprocessor) runs the check
registered under that grade id (:data:`rlhf_lab.judging.CHECKS`) itself:

* the check draws fresh inputs from a generator seeded here with ``secrets`` (the seed never
  leaves this process), computes every expected value with this process's own copy of the course
  library, and decides;
* whatever it needs from the student's code it asks the kernel for, one request at a time
  (:class:`RemoteStudent`: "call ``ppo_loss`` on these arrays", "the gradient of ...", "the value
  of ``run``"), over a second client connection to the same kernel; the kernel answers with plain
  data (numbers, arrays, tuples and dicts of them, :mod:`rlhf_lab.judging.wire`), and anything else
  is a failure with a message;
* the cell's outputs are then set to the verdict: nothing (full points) or one ``GradingError``
  output carrying the check's message. Nothing the kernel printed or displayed decides a grade:
  the test cell's own code never runs in the kernel during autograding (its visible checks are for
  students working on the notebook).

The source of a test cell is the instructor's (nbgrader restores locked cells from the gradebook
before executing), so the grade id the judge reads is trusted.

**One judge for a class run.** When the course's executors grade a class they start a judge
server (:mod:`.judge_server`) that lives for the whole run, so the references are imported and
compiled once per run, not once per student. Its address and key reach this process through the
environment (:data:`ADDRESS_ENV`, :data:`AUTHKEY_ENV`, read and removed when this module is loaded,
before any kernel starts). Then :class:`ServerLink` sends the grade id there; the server runs the
same :func:`run_check` (its own secret seed) with a student whose every request comes back over
the connection to this process, which asks the kernel through :class:`RemoteStudent` as above and
returns the plain-data answer; the server returns the verdict. A server that cannot be reached,
refuses the key or dies in the middle of a check makes this process judge the cell itself (same
code, same verdict) and log one line. Without a server (bare ``nbgrader autograde``, Formgrader's
button) everything runs here, as described above.
"""
from __future__ import annotations

import ast
import os
import re
import secrets
import time

from nbformat.notebooknode import NotebookNode

#: The hidden region of a judged test cell.
JUDGE_LINE = re.compile(r'### BEGIN HIDDEN TESTS\n\s*grading\.judge\("([A-Za-z0-9_]+)"\)\s*\n### END HIDDEN TESTS')
#: ``ename`` of the output that carries a failed check's message.
FAILED = "GradingError"

_INSTALL = """
import types as _rlhf_types
_rlhf_wire_module = _rlhf_types.ModuleType("_rlhf_judge_wire")
exec(compile({source!r}, "<judge wire>", "exec"), _rlhf_wire_module.__dict__)
_rlhf_judge_bridge = _rlhf_wire_module.bridge
del _rlhf_types, _rlhf_wire_module
"""


#: Environment variables naming the judge server of this run (set for the nbgrader process only;
#: a sandboxed kernel gets a clean environment, and this module removes them from its own).
ADDRESS_ENV = "RLHF_JUDGE_ADDRESS"
AUTHKEY_ENV = "RLHF_JUDGE_AUTHKEY"
#: Version of the messages between :class:`ServerLink` and the server.
PROTOCOL = 1
#: What a judge server may ask this process to forward to the kernel.
STUDENT_METHODS = ("call", "grad", "value", "scenario")


class KernelGone(Exception):
    """The kernel stopped answering (dead, or still busy after the timeout and an interrupt)."""


class ServerUnavailable(Exception):
    """The judge server could not be reached, refused us, died or stopped answering."""


class CheckCrashed(Exception):
    """The check itself raised (not a verdict) while running in the judge server."""

    def __init__(self, kind: str, text: str):
        super().__init__(f"{kind}: {text}")
        self.kind, self.text = kind, text


def judged_check(cell) -> str | None:
    """The grade id a test cell's hidden region asks the judge for, or ``None`` (not a judged cell)."""
    meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
    if cell.get("cell_type") != "code" or not meta.get("grade") or meta.get("solution"):
        return None
    match = JUDGE_LINE.search(cell.get("source", ""))
    return match.group(1) if match else None


def error_output(message: str, ename: str = FAILED) -> NotebookNode:
    """The one output of a failed check (nbgrader scores a test cell with an error output zero)."""
    return NotebookNode(output_type="error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"])


def _wire():
    from rlhf_lab.judging import wire

    return wire


class RemoteStudent:
    """The judging vocabulary (:class:`rlhf_lab.judging.core.Student`) over a kernel client.

    ``client`` is a started ``jupyter_client.BlockingKernelClient`` of the student's kernel on which
    the wire's ``bridge`` has been installed (:func:`install_bridge`); ``timeout`` bounds each request;
    ``interrupt()`` is called when a request times out.
    """

    def __init__(self, client, spec, timeout: float, interrupt=None):
        from rlhf_lab.judging import core

        self._client, self._spec, self._timeout, self._interrupt = client, spec, timeout, interrupt
        self._core = core

    def _ask(self, text: str, task: str, what: str):
        core, wire = self._core, _wire()
        try:
            reply = self._client.execute_interactive(
                "", silent=True, store_history=False, user_expressions={"r": f"_rlhf_judge_bridge({text!r})"},
                timeout=self._timeout, output_hook=lambda msg: None, allow_stdin=False)
        except TimeoutError:
            if self._interrupt is not None:
                self._interrupt()
            raise core.GradingError(f"{task}: your code did not answer within {self._timeout:g} s "
                                    "(an infinite loop, or far too much work for this test?)") from None
        content = reply.get("content", {})
        expr = (content.get("user_expressions") or {}).get("r", {})
        if content.get("status") != "ok" or expr.get("status") != "ok":
            detail = expr.get("ename") or content.get("ename") or "no answer"
            raise core.GradingError(f"{task}: the notebook's kernel could not answer the grader ({detail}: "
                                    f"{expr.get('evalue') or content.get('evalue') or ''}); restart the kernel "
                                    "and run the notebook from the top")
        try:
            answer = ast.literal_eval(expr.get("data", {}).get("text/plain", ""))
            ok, payload = wire.response(answer)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, wire.Refused) as exc:
            raise core.GradingError(f"{task}: the kernel's answer could not be read ({exc})") from None
        if not ok:
            kind, error = payload
            if kind == "missing":
                raise core.GradingError(f"{task}: `{error}` is not defined: run the cell that defines it "
                                        "(restart the kernel and run the notebook from the top)")
            if kind == "refused":
                raise core.GradingError(f"{what}: expected numbers or arrays (or a tuple/dict of them), got {error}")
            raise core.GradingError(f"{task}: your function raised {error}")
        return core.plain(payload, what)

    def call(self, name: str, *args, **kwargs):
        return self._ask(_wire().request("call", name, args, kwargs), name, f"{name}: its result")

    def grad(self, name: str, argnums, *args, **kwargs):
        return self._ask(_wire().request("grad", name, args, kwargs, argnums=argnums), name, f"{name}: its gradient")

    def value(self, name: str):
        return self._ask(_wire().request("value", name), self._spec.task, f"{self._spec.task}: {name}")

    def scenario(self, source, needs, *args, **kwargs):
        return self._ask(_wire().request("scenario", None, args, kwargs, source=source, needs=needs),
                         self._spec.task, f"{self._spec.task}: {source.name}")


def install_bridge(client, timeout: float = 60.0) -> None:
    """Define ``_rlhf_judge_bridge`` in the kernel (the wire module's source, executed there)."""
    wire = _wire()
    with open(wire.__file__, encoding="utf-8") as handle:
        source = handle.read()
    reply = client.execute_interactive(_INSTALL.format(source=source), silent=True, store_history=False,
                                       timeout=timeout, output_hook=lambda msg: None, allow_stdin=False)
    if reply.get("content", {}).get("status") != "ok":
        raise KernelGone("the grader could not talk to the notebook's kernel")


def run_check(name: str, student, seed: int | None = None) -> list:
    """Decide the check ``name`` with ``student``: ``[]`` (full points) or ``[error output]``."""
    from rlhf_lab.judging import CHECKS, core

    spec = CHECKS.get(name)
    if spec is None:
        return [error_output(f"no check is registered for the test cell {name!r}: the grader's course library is "
                             "older than the notebook (ask the instructor)")]
    import numpy as np

    rng = np.random.default_rng(secrets.randbits(64) if seed is None else seed)
    try:
        spec.run(student, rng, _reference())
    except core.GradingError as exc:
        return [error_output(str(exc))]
    return []


_REFERENCE = []


def _reference():
    """The course library's reference functions in this process (built once per process)."""
    if not _REFERENCE:
        from rlhf_lab.judging import core

        _REFERENCE.append(core.library_reference())
    return _REFERENCE[0]


def take_server_env(environ=None) -> tuple[str, bytes] | None:
    """The judge server's ``(address, authkey)`` from ``environ`` (default ``os.environ``), which loses
    both variables (so no kernel started from this process inherits them); ``None`` when unset."""
    environ = os.environ if environ is None else environ
    address, key = environ.pop(ADDRESS_ENV, None), environ.pop(AUTHKEY_ENV, None)
    if not address or not key:
        return None
    try:
        return address, bytes.fromhex(key)
    except ValueError:
        return None


#: This process's judge server, taken from the environment when the module is loaded.
SERVER = take_server_env()


class ServerLink:
    """The connection of one grader process to a judge server (see the module docstring).

    Messages (pickled over an authenticated Unix socket): we send ``("judge", PROTOCOL, grade_id)``;
    the server sends ``("ask", method, args, kwargs)`` any number of times, each answered with
    ``("ok", plain_value)``, ``("fail", message)`` (the request raised :class:`GradingError`, for
    example a timeout) or ``("abort",)`` (anything else, such as :class:`KernelGone`, which is then
    raised here once the server said ``("aborted",)``); finally ``("verdict", None | message)`` or
    ``("crashed", exception_name, text)``. ``wait`` bounds each wait for the server (seconds).
    """

    def __init__(self, address: str, authkey: bytes, wait: float = 120.0):
        self.address, self._authkey, self.wait = address, authkey, wait
        self._conn = None

    def _connection(self):
        if self._conn is None:
            from multiprocessing import AuthenticationError
            from multiprocessing.connection import Client

            try:
                self._conn = Client(self.address, family="AF_UNIX", authkey=self._authkey)
            except (OSError, EOFError, AuthenticationError) as exc:
                raise ServerUnavailable(f"cannot connect to {self.address} ({type(exc).__name__}: {exc})") from None
        return self._conn

    def _recv(self):
        conn = self._conn
        try:
            if not conn.poll(self.wait):
                raise ServerUnavailable(f"no answer within {self.wait:g} s")
            return conn.recv()
        except (OSError, EOFError) as exc:
            raise ServerUnavailable(f"the connection was lost ({type(exc).__name__})") from None
        except ServerUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - an unreadable message
            raise ServerUnavailable(f"unreadable message ({type(exc).__name__}: {exc})") from None

    def _send(self, message) -> None:
        try:
            self._conn.send(message)
        except (OSError, EOFError, ValueError) as exc:
            raise ServerUnavailable(f"the connection was lost ({type(exc).__name__})") from None

    def judge(self, name: str, student) -> list:
        """The outputs of the check ``name`` (as :func:`run_check`), decided by the server, each of its
        requests answered by ``student``. Raises :class:`ServerUnavailable` (judge locally then),
        :class:`CheckCrashed`, or whatever ``student`` raised other than a ``GradingError``."""
        from rlhf_lab.judging import core

        try:
            self._connection()
            self._send(("judge", PROTOCOL, name))
            pending = None
            while True:
                message = self._recv()
                kind = message[0] if isinstance(message, tuple) and message else None
                if kind == "ask" and len(message) == 4 and message[1] in STUDENT_METHODS and pending is None:
                    _, method, args, kwargs = message
                    try:
                        reply = ("ok", getattr(student, method)(*args, **kwargs))
                    except core.GradingError as exc:
                        reply = ("fail", str(exc))
                    except Exception as exc:  # noqa: BLE001 - raised here once the server stopped the check
                        pending, reply = exc, ("abort",)
                    self._send(reply)
                elif kind == "aborted" and pending is not None:
                    raise pending
                elif kind == "verdict" and len(message) == 2 and (message[1] is None or isinstance(message[1], str)):
                    return [] if message[1] is None else [error_output(message[1])]
                elif kind == "crashed" and len(message) == 3:
                    raise CheckCrashed(str(message[1]), str(message[2]))
                else:
                    raise ServerUnavailable(f"unexpected message {str(message)[:80]!r}")
        except ServerUnavailable:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None


def judge_enabled() -> bool:
    """False only with ``RLHF_JUDGE=0``: the benchmark's baseline, where the same checks run inside the
    kernel (``grading.judge`` with its private copy of the checks), as they did before the judge."""
    return os.environ.get("RLHF_JUDGE", "1") != "0"


class JudgeCells:
    """Mixin for nbgrader's ``Execute``: judged test cells are decided here, not run in the kernel.

    ``nbgrader_config.py`` builds ``class Execute(JudgeCells, kernel_guard.Execute)``. A request that
    times out interrupts the kernel; a kernel that is gone stops the notebook like a dead kernel does
    in :mod:`.kernel_guard` (later cells are marked not run).
    """

    _judge_client = None
    _judge_km = None
    _judge_link = None
    _judge_link_broken = False

    def create_kernel_manager(self):
        """The kernel manager, told that the judge decides this notebook's tests (the sandbox then gives
        the kernel the library build without the functions the notebook asks students to write)."""
        km = super().create_kernel_manager()
        if judge_enabled() and km.has_trait("judged"):
            km.judged = True
        return km

    def preprocess_cell(self, cell, resources, index):
        name = judged_check(cell)
        if name is None or getattr(self, "_stopped", None) is not None or not judge_enabled():
            return super().preprocess_cell(cell, resources, index)
        timeout = float(getattr(self, "timeout", None) or os.environ.get("RLHF_CELL_TIMEOUT", 60))
        try:
            client = self._client_for_judge(timeout)
            student = RemoteStudent(client, self._spec_or_stub(name), timeout, interrupt=self._interrupt_for_judge)
            cell.outputs = self._decide(name, student)
        except CheckCrashed as exc:
            self.log.error("judging %s failed: %s", name, exc)
            cell.outputs = [error_output(f"the grader could not run this check ({exc}); "
                                         "the instructor will look at it", "GraderError")]
        except KernelGone as exc:
            cell.outputs = [error_output(str(exc), "KernelStopped")]
            if hasattr(self, "_stopped"):
                self._stopped = (index, str(exc))
        except Exception as exc:  # noqa: BLE001 - a failure of the grader itself must not read as the student's
            self.log.error("judging %s failed: %s: %s", name, type(exc).__name__, exc)
            cell.outputs = [error_output(f"the grader could not run this check ({type(exc).__name__}: {exc}); "
                                         "the instructor will look at it", "GraderError")]
        cell.execution_count = None
        return cell, resources

    def _decide(self, name: str, student) -> list:
        """The check's outputs: from this run's judge server when there is one, else from this process."""
        link = self._link()
        if link is not None:
            started = time.monotonic()
            try:
                return link.judge(name, student)
            except ServerUnavailable as exc:
                self._judge_link_broken = True
                self._close_judge_link()
                self.log.warning("judge server %s unavailable after %.1f s (%s): judging in this process",
                                 link.address, time.monotonic() - started, exc)
        return run_check(name, student)

    def _link(self):
        if self._judge_link is None and SERVER is not None and not self._judge_link_broken:
            self._judge_link = ServerLink(*SERVER)
        return self._judge_link

    def _close_judge_link(self) -> None:
        if self._judge_link is not None:
            self._judge_link.close()
            self._judge_link = None

    @staticmethod
    def _spec_or_stub(name):
        from rlhf_lab.judging import CHECKS
        from rlhf_lab.judging.registry import Check

        return CHECKS.get(name) or Check(name=name, run=None, task=name, needs=())

    def _client_for_judge(self, timeout: float):
        km = getattr(self, "km", None)
        if km is None:
            raise KernelGone("the notebook's kernel is not running")
        if self._judge_km is not km or self._judge_client is None:
            self._close_judge_client()
            from jupyter_client import BlockingKernelClient

            client = BlockingKernelClient()
            client.load_connection_info(km.get_connection_info())
            client.start_channels()
            try:
                client.wait_for_ready(timeout=timeout)
                install_bridge(client, timeout)
            except (RuntimeError, TimeoutError) as exc:
                client.stop_channels()
                raise KernelGone(f"the notebook's kernel did not answer the grader ({exc})") from None
            self._judge_client, self._judge_km = client, km
        return self._judge_client

    def _interrupt_for_judge(self) -> None:
        km = getattr(self, "km", None)
        try:
            if km is not None:
                from jupyter_core.utils import run_sync

                run_sync(km.interrupt_kernel)()
        except Exception as exc:  # noqa: BLE001 - the next cell's timeout handling takes over
            self.log.warning("could not interrupt the kernel after a judge timeout: %s", exc)

    def _close_judge_client(self) -> None:
        if self._judge_client is not None:
            try:
                self._judge_client.stop_channels()
            except Exception:  # noqa: BLE001
                pass
        self._judge_client, self._judge_km = None, None

    def preprocess(self, nb, resources=None, km=None):
        try:
            return super().preprocess(nb, resources, km)
        finally:
            self._close_judge_client()
            self._close_judge_link()
