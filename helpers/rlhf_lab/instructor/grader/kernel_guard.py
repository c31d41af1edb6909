"""Kernel-level limits for autograding untrusted notebooks (wired in ``nbgrader_config.py``).

nbgrader runs each submission in a Jupyter kernel that inherits the grader's process limits and
environment. This module changes two things, both in the grader's own process, so no student code
can undo them before they take effect:

:class:`LimitedKernelManager` (the kernel launcher)
    Starts the kernel with OS resource limits set by ``setrlimit`` between ``fork`` and ``exec``
    (a ``preexec_fn``), so they hold from the kernel's first instruction:

    * ``RLIMIT_AS`` (address space) ``RLHF_KERNEL_MEMORY_MB`` MiB, default 4096. A cell that
      allocates far too much gets a ``MemoryError`` (or, inside native code, the kernel dies)
      instead of driving the machine into the OOM killer. A JAX kernel that has run the whole
      lesson maps about 1.6 GiB, so 4 GiB leaves ample room for correct work.
    * ``RLIMIT_FSIZE`` (largest file the kernel may write) ``RLHF_KERNEL_FILE_MB`` MiB, default 1024.
    * ``RLIMIT_CORE`` 0 (a crashing kernel does not dump a multi-GiB core file).

    With ``compile_cache_root`` set (``nbgrader_config.py`` sets it to the course root), each
    kernel also gets a private, verified copy of its assignment's trusted JAX compilation cache
    (:mod:`.compile_cache`), deleted when the kernel stops: the programs every student's notebook
    compiles identically are loaded instead of compiled.

    Its :meth:`~LimitedKernelManager.wrap_launch` hook is where the sandbox
    (:class:`.sandbox.SandboxedKernelManager`, selected by ``c.Execute.kernel_manager_class`` in
    ``nbgrader_config.py``; see ``docs/sandbox.md``) turns the kernel command into a bubblewrap one.

    ``RLHF_KERNEL_SCRUB_ENV`` (comma-separated) removes environment variables from the kernel,
    for example ``NBGRADER_EXECUTION``, which nbgrader sets so a notebook can tell it is being
    graded. It is kept by default because the course's own locked cells use it to skip the live
    explorer; student cells that read it are blocked by the integrity scan (:mod:`.integrity`).

:class:`Execute` (nbgrader's ``Execute`` with one more guarantee; alias ``GuardedExecute``)
    Stock nbgrader aborts a student's whole assignment when the kernel dies (``os._exit``, a
    native crash, the memory limit) or ignores the interrupt sent at the per-cell timeout (an
    infinite loop with ``SIGINT`` ignored): nothing of that student is graded and the autograded
    folder is deleted. This ``Execute`` instead records an error output on the cell that
    killed or hung the kernel, kills the kernel's process group, marks every later code cell
    as not run (an error output, so its test scores zero) and lets nbgrader save the grades of
    everything that finished. The student is graded on what ran; the next student starts a fresh
    kernel as usual.
"""
from __future__ import annotations

import asyncio
import atexit
import importlib.util
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading

from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute as _NbgraderExecute
from traitlets import Integer, Unicode

MIB = 1024 * 1024
#: ``ename`` of the error output put on a cell that killed or hung the kernel.
KERNEL_STOPPED = "KernelStopped"
#: ``ename`` of the error output put on every later code cell, which did not run.
NOT_RUN = "CellNotRun"
#: Bytes of a kernel's own stdout/stderr (outside cells) the grader keeps; the rest is read and dropped.
OUTPUT_KEEP = 64 * 1024


def _by_path(filename: str, name: str):
    """A module of this folder loaded by file path (importing ``rlhf_lab`` would import JAX here)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), filename))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _compile_cache_module():
    """:mod:`.compile_cache`, loaded by file path."""
    return _by_path("compile_cache.py", "rlhf_lab_course_compile_cache")


def _timeline():
    """:mod:`.timeline`, loaded by file path."""
    return _by_path("timeline.py", "rlhf_lab_course_timeline")


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def limits_preexec(memory_mb: int, file_mb: int):
    """Return a ``preexec_fn`` that sets the kernel's resource limits.

    Soft and hard limits are both set, so an unprivileged kernel cannot raise them again (a kernel
    running as root could; see ``docs/security.md`` for isolating the grader itself).
    ``memory_mb <= 0`` / ``file_mb <= 0`` leave that limit unchanged.
    """

    def preexec() -> None:  # runs in the child between fork and exec: keep it tiny
        if memory_mb > 0:
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb * MIB, memory_mb * MIB))
        if file_mb > 0:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb * MIB, file_mb * MIB))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return preexec


class OutputTail:
    """The read end of a kernel's stdout/stderr pipe, drained by a daemon thread until every writer
    closed it (the kernel and everything it started are gone): the first ``keep`` bytes are kept in
    :attr:`data`, the rest only counted (:attr:`total`), so a kernel cannot fill the grader's memory."""

    def __init__(self, read_fd: int, keep: int = OUTPUT_KEEP):
        self.data = bytearray()
        self.total = 0
        self.reported = False
        self._fd, self._keep = read_fd, keep
        self._thread = threading.Thread(target=self._drain, name="kernel-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while True:
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    break
                self.total += len(chunk)
                room = self._keep - len(self.data)
                if room > 0:
                    self.data += chunk[:room]
        except OSError:
            pass
        finally:
            os.close(self._fd)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the end of the output; True when it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def bwrap_lines(self, limit: int = 5, width: int = 200) -> list[str]:
        """Up to ``limit`` lines that ``bwrap`` printed (they say why a sandbox did not start),
        non-printable characters replaced and each cut to ``width`` characters."""
        lines = []
        for raw in bytes(self.data).splitlines():
            if raw.startswith(b"bwrap: "):
                text = raw.decode("utf-8", "replace")
                lines.append("".join(ch if ch.isprintable() else "?" for ch in text)[:width])
                if len(lines) == limit:
                    break
        return lines


def isolated_stdio(kw: dict) -> OutputTail:
    """Set the ``Popen`` keywords in ``kw`` so the kernel inherits no descriptor of the grader:
    stdin ``/dev/null``, stdout and stderr a new pipe, every other descriptor closed. Returns the
    reader of the pipe; the caller closes ``kw["stdout"]`` (the write end) once the kernel started."""
    read_fd, write_fd = os.pipe()
    os.set_inheritable(read_fd, False)
    kw.update(stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd, close_fds=True)
    kw.pop("pass_fds", None)
    return OutputTail(read_fd)


class LimitedKernelManager(AsyncKernelManager):
    """An ``AsyncKernelManager`` whose kernels start under resource limits (see the module docstring)."""

    memory_mb = Integer(
        _env_int("RLHF_KERNEL_MEMORY_MB", 4096),
        help="Address-space limit of the kernel in MiB (RLIMIT_AS); 0 for none.",
    ).tag(config=True)
    file_mb = Integer(
        _env_int("RLHF_KERNEL_FILE_MB", 1024),
        help="Largest file the kernel may write, in MiB (RLIMIT_FSIZE); 0 for none.",
    ).tag(config=True)
    scrub_env = Unicode(
        os.environ.get("RLHF_KERNEL_SCRUB_ENV", ""),
        help="Comma-separated environment variables removed from the kernel's environment "
             "(for example NBGRADER_EXECUTION; empty by default because the course's own locked "
             "cells read it to skip the live explorer while autograding).",
    ).tag(config=True)

    compile_cache_root = Unicode(
        "",
        help="Course root whose .cache/jax-compile-seed/<assignment>/ seeds each kernel's private JAX "
             "compilation cache (empty: no cache).",
    ).tag(config=True)

    seed_cache_dir = Unicode(
        "",
        help="Build a seed: the kernel writes its JAX compilation cache straight into this folder "
             "(used by compile_cache.ensure_seed on the trusted source notebooks only).",
    ).tag(config=True)

    _kernel_pgid: int | None = None
    _cache_dir: str | None = None
    _cache_copy = None  # the compile_cache.PrivateCopy behind _cache_dir
    _output: OutputTail | None = None

    @property
    def kernel_output(self) -> bytes:
        """The first :data:`OUTPUT_KEEP` bytes the kernel wrote to its stdout/stderr (outside cells)."""
        return bytes(self._output.data) if self._output is not None else b""

    def kernel_memory_mb(self) -> int:
        """The kernel's address-space limit (RLIMIT_AS) in MiB: :attr:`memory_mb` here; the
        sandbox subtracts its private ``/tmp``, which is memory too."""
        return self.memory_mb

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        env = dict(kw.get("env") or os.environ)
        for name in filter(None, (n.strip() for n in self.scrub_env.split(","))):
            env.pop(name, None)
        for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                     "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"):
            env.pop(name, None)  # only a private copy made here may serve as a kernel's cache
        if self.seed_cache_dir:
            env.update(_compile_cache_module().kernel_env(self.seed_cache_dir))
        elif self.compile_cache_root and kw.get("cwd"):
            cc = _compile_cache_module()
            try:  # verified now, written while the kernel starts
                copy = cc.start_private_copy(cc.seed_for_notebook_dir(self.compile_cache_root, kw["cwd"]))
            except Exception as exc:  # noqa: BLE001 - no cache is always a safe fallback
                self.log.warning("JAX compilation cache not used: %s", exc)
                copy = None
            if copy is not None:
                self._cache_copy, self._cache_dir = copy, str(copy.path)
                atexit.register(copy.remove)  # also if the grader stops abruptly
                env.update(cc.kernel_env(copy.path))
        kw["env"] = env
        kw["preexec_fn"] = limits_preexec(self.kernel_memory_mb(), self.file_mb)
        kernel_cmd, kw = self.wrap_launch(list(kernel_cmd), kw)
        self._output = isolated_stdio(kw)
        try:
            await super()._async_launch_kernel(kernel_cmd, **kw)
        finally:
            os.close(kw["stdout"])  # the kernel holds its own copy of the write end
        provisioner = self.provisioner
        self._kernel_pgid = getattr(provisioner, "pgid", None)

    def report_kernel_output(self, wait: float = 0.0) -> None:
        """Log what ``bwrap`` printed (a sandbox that could not start says why) and how much the
        kernel wrote outside cells; the output itself stays in :attr:`kernel_output`."""
        tail = self._output
        if tail is None or tail.reported:
            return
        if not tail.wait(wait):
            return  # still open: reported at the next call (release_sandbox, cleanup)
        tail.reported = True
        for line in tail.bwrap_lines():
            self.log.warning("kernel sandbox: %s", line)
        if tail.total:
            self.log.debug("the kernel wrote %d bytes to its stdout/stderr (first %d kept)",
                           tail.total, OUTPUT_KEEP)

    def wrap_launch(self, kernel_cmd: list, kw: dict) -> tuple[list, dict]:
        """Last step before the kernel process starts: subclasses (the sandbox, :mod:`.sandbox`)
        rewrite the command and the ``Popen`` keywords here. This class changes nothing."""
        return kernel_cmd, kw

    def kill_process_group(self) -> None:
        """SIGKILL the kernel's whole process group (the kernel and anything it spawned)."""
        pgid = self._kernel_pgid
        if pgid and pgid != os.getpgid(0):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        # Whatever the student's code left running in the kernel's group goes with the kernel.
        self.kill_process_group()
        self.report_kernel_output(wait=0.5)
        if self._cache_copy is not None:
            self._cache_copy.remove()
            self._cache_copy = None
        self._cache_dir = None
        await super()._async_cleanup_resources(restart=restart)


def _error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"\x1b[0;31m{ename}\x1b[0m: {evalue}"])


class Execute(_NbgraderExecute):
    """nbgrader's ``Execute`` that survives a dead or unresponsive kernel (see the module docstring).

    A drop-in replacement: same class name, so every ``c.Execute.*`` setting of
    ``nbgrader_config.py`` (timeout, iopub_timeout, ...) applies to it unchanged, and
    ``c.Execute.kernel_manager_class`` (which nbgrader's own ``Execute`` overrides with a keyword)
    is honoured. The kernel manager is told the notebook's name (``notebook_name``) and released
    after every notebook (``release_sandbox``), also when the kernel died before nbclient's cleanup.
    """

    kill_grace = Integer(5, help="Seconds to wait for a stuck kernel before killing it.").tag(config=True)

    def __init__(self, *args, **kwargs):
        explicit = kwargs.get("kernel_manager_class")
        kwargs.setdefault("kernel_manager_class", LimitedKernelManager)
        super().__init__(*args, **kwargs)
        # nbgrader's Execute passes its own default as a keyword, which would hide
        # ``c.Execute.kernel_manager_class``: honour the configured class (nbgrader_config.py selects
        # the sandboxed manager there), else the limited one.
        configured = None
        if explicit is None and "Execute" in self.config and "kernel_manager_class" in self.config.Execute:
            configured = self.config.Execute.kernel_manager_class
        self.kernel_manager_class = explicit or configured or LimitedKernelManager
        self._stopped: tuple[int, str] | None = None
        self._watchdog_killed = False

    def create_kernel_manager(self):
        """nbclient's manager, told which notebook it runs (the sandbox picks its library build)."""
        km = super().create_kernel_manager()
        name = (self.resources or {}).get("unique_key") if isinstance(self.resources, dict) else None
        if name and km.has_trait("notebook_name"):
            km.notebook_name = str(name)
        return km

    async def _async_handle_timeout(self, timeout, cell=None):
        """Interrupt as nbgrader does; if the kernel is still busy ``kill_grace`` s later, kill it.

        Without this, a cell that ignores SIGINT keeps the grader waiting for the whole
        ``iopub_timeout`` and then fails the student's entire assignment.
        """
        reply = await super()._async_handle_timeout(timeout, cell)
        task = getattr(self, "task_poll_for_reply", None)
        if task is not None:
            asyncio.ensure_future(self._kill_if_still_busy(task))
        return reply

    async def _kill_if_still_busy(self, task) -> None:
        await asyncio.sleep(self.kill_grace)
        if not task.done():
            self._watchdog_killed = True
            self._kill_kernel()
            task.cancel()  # nbclient turns the cancelled wait into DeadKernelError

    def preprocess(self, nb, resources=None, km=None):
        self._stopped = None
        name = (resources or {}).get("unique_key") if isinstance(resources, dict) else None
        try:
            with _timeline().phase("notebook", notebook=name):
                nb, resources = super().preprocess(nb, resources, km)
        finally:
            release = getattr(getattr(self, "km", None), "release_sandbox", None)
            if release is not None:
                release()
        if self._stopped is not None:
            index, reason = self._stopped
            resources.setdefault("kernel_stopped", {"cell": index, "reason": reason})
        return nb, resources

    def preprocess_cell(self, cell, resources, index):
        if self._stopped is not None:
            if cell.cell_type == "code" and cell.source.strip():
                stopped_at, reason = self._stopped
                cell.outputs = [_error_output(
                    NOT_RUN, f"not run: the kernel stopped in cell {stopped_at} ({reason})")]
                cell.execution_count = None
            return cell, self.resources
        self._watchdog_killed = False
        try:
            grade_id = (cell.get("metadata", {}).get("nbgrader", {}) or {}).get("grade_id")
            with _timeline().phase("cell", index=index, grade_id=grade_id, code=cell.cell_type == "code"):
                return super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            if self._watchdog_killed:
                reason = ("the cell was still running after the per-cell timeout and ignored the "
                          "interrupt, so the kernel was killed")
            else:
                reason = "the kernel died while this cell ran (os._exit, a crash, or the memory limit)"
        except CellTimeoutError:
            reason = ("the cell was still running after the per-cell timeout and ignored the "
                      "interrupt, so the kernel was killed")
        self.log.error("Cell %d: %s", index, reason)
        cell.outputs = list(cell.get("outputs", [])) + [_error_output(KERNEL_STOPPED, reason)]
        self._stopped = (index, reason)
        self._kill_kernel()
        return cell, self.resources

    def _kill_kernel(self) -> None:
        km = getattr(self, "km", None)
        if km is None:
            return
        if isinstance(km, LimitedKernelManager):
            km.kill_process_group()
        else:  # pragma: no cover - only when someone configures another kernel manager
            provisioner = getattr(km, "provisioner", None)
            process = getattr(provisioner, "process", None)
            if process is not None:
                process.kill()


#: Readable alias of :class:`Execute`.
GuardedExecute = Execute
