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
"""
from __future__ import annotations

import ast
import os
import re
import secrets

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


class KernelGone(Exception):
    """The kernel stopped answering (dead, or still busy after the timeout and an interrupt)."""


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
            cell.outputs = run_check(name, student)
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
