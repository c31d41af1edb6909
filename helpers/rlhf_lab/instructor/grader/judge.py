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

import json
import os
import re
import secrets
import sys
import threading
import time
import weakref

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


class DeadlineExceeded(Exception):
    """The judge server gave no verdict within the cell's deadline (plus :attr:`ServerLink.margin`)."""


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

def deadline_message(task: str, timeout: float) -> str:
    """The failure of a judged cell whose test as a whole ran out of the per-cell timeout."""
    return (f"{task}: this whole test took longer than the per-cell timeout of {timeout:g} s (all of its calls "
            "to your code together; the kernel was interrupted): look for an infinite loop or far too much work "
            "for this test, then restart the kernel and run the notebook from the top")


def too_large_message(task: str, reason) -> str:
    """The failure of a request whose answer is over the grader's bounds (``reason``: a ``TooLarge``)."""
    return (f"{task}: your code's answer to the grader {reason}. Return only what the task asks for (numbers "
            "or arrays of the sizes the test passes in, or a tuple/dict of them), without large lists, deep "
            "nesting or extra values")


def _expression_text(reply) -> tuple[bool, object, str]:
    """``(ok, text/plain, error detail)`` of the user expression ``r`` in an execute reply, whatever
    shape the (untrusted) kernel gave that reply."""
    content = reply.get("content") if isinstance(reply, dict) else None
    content = content if isinstance(content, dict) else {}
    expressions = content.get("user_expressions")
    expr = expressions.get("r") if isinstance(expressions, dict) else None
    expr = expr if isinstance(expr, dict) else {}
    if content.get("status") != "ok" or expr.get("status") != "ok":
        detail = f"{expr.get('ename') or content.get('ename') or 'no answer'}: {expr.get('evalue') or content.get('evalue') or ''}"
        return False, None, detail[:500]
    data = expr.get("data")
    return True, data.get("text/plain") if isinstance(data, dict) else None, ""


#: Largest message (frame) the grader's own client of a student's kernel accepts on the shell,
#: control and stdin channels, and on iopub (the kernel's outputs, discarded while judging). ZeroMQ
#: drops a larger message before any of it is allocated or parsed here and disconnects the kernel
#: for good (no reconnection after a protocol error); :func:`shell_monitor` sees that disconnection
#: and the request fails at once with :func:`too_large_message`. A judge response is at most
#: ``wire.MAX_LITERAL_CHARS`` (65,538) characters; the rest of a reply is a few KiB.
KERNEL_REPLY_MAX_BYTES = 1024 * 1024
KERNEL_OUTPUT_MAX_BYTES = 16 * 1024 * 1024


def bounded_context():
    """A ZeroMQ context whose sockets refuse messages over :data:`KERNEL_REPLY_MAX_BYTES`
    (:data:`KERNEL_OUTPUT_MAX_BYTES` for the iopub subscriber) before reading them."""
    import zmq

    class BoundedContext(zmq.Context):
        def socket(self, socket_type, *args, **kwargs):
            sock = super().socket(socket_type, *args, **kwargs)
            limit = KERNEL_OUTPUT_MAX_BYTES if socket_type == zmq.SUB else KERNEL_REPLY_MAX_BYTES
            sock.setsockopt(zmq.MAXMSGSIZE, limit)
            return sock

    return BoundedContext()


#: Seconds a refused reply waits for the kernel process to be seen dead (a kernel that died in the
#: middle of a request also disconnects): only on that failure path, never on a normal reply.
GONE_GRACE = 0.5

_MONITORS = weakref.WeakKeyDictionary()


def shell_monitor(client):
    """The ZeroMQ monitor (``EVENT_DISCONNECTED``) of ``client``'s shell socket, created on first use
    and kept for that socket; ``None`` for a socket without ``MAXMSGSIZE`` (nothing refuses its
    messages, so nothing to watch)."""
    import zmq

    sock = client.shell_channel.socket
    if sock.getsockopt(zmq.MAXMSGSIZE) < 0:
        return None
    monitor = _MONITORS.get(sock)
    if monitor is None:
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        monitor.setsockopt(zmq.LINGER, 0)
        _MONITORS[sock] = monitor
    return monitor


def close_shell_monitor(client) -> None:
    """Stop and close :func:`shell_monitor`'s socket of ``client`` (before its channels stop)."""
    sock = getattr(getattr(client, "shell_channel", None), "socket", None)
    monitor = _MONITORS.pop(sock, None) if sock is not None else None
    if monitor is not None:
        try:
            sock.disable_monitor()
        except Exception:  # noqa: BLE001 - the socket is closing anyway
            pass
        monitor.close(linger=0)


def _disconnected(monitor) -> bool:
    """True when ``monitor`` holds a disconnection event (every pending event is read)."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    seen = False
    while monitor.poll(0):
        seen |= recv_monitor_message(monitor, zmq.NOBLOCK)["event"] == zmq.EVENT_DISCONNECTED
    return seen


class ReplyRefused(Exception):
    """The kernel's reply was over :data:`KERNEL_REPLY_MAX_BYTES`: dropped unread, the kernel disconnected."""


#: iopub messages discarded per wake-up while waiting for a reply (the shell is polled in between)
_IOPUB_BATCH = 64


#: Seconds between two looks at whether the kernel still runs while a reply is awaited.
ALIVE_EVERY = 1.0


def wait_reply(client, msg_id: str, deadline: float, alive=None) -> dict:
    """The shell reply to ``msg_id``, waiting at most until ``deadline`` (``time.monotonic()``).

    One poll on the shell socket, the iopub socket (its messages are discarded, as
    ``execute_interactive``'s ``output_hook`` did) and :func:`shell_monitor` (created before the
    request is sent: a monitor sees only later events): a reply comes back as soon as it arrives;
    replies to other requests are skipped. Raises ``TimeoutError`` at the deadline and
    :class:`ReplyRefused` as soon as the shell socket was disconnected (a message over its
    ``MAXMSGSIZE``, or a kernel that died). With ``alive``, a kernel process that is gone is noticed
    within :data:`ALIVE_EVERY` seconds even without that event (``ReplyRefused`` too: the caller
    tells the two apart).
    """
    import zmq

    shell, iopub = client.shell_channel.socket, client.iopub_channel.socket
    monitor = shell_monitor(client)
    poller = zmq.Poller()
    for sock in (shell, iopub, monitor):
        if sock is not None:
            poller.register(sock, zmq.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no reply before the deadline")
        wait = left if alive is None else min(left, ALIVE_EVERY)
        events = dict(poller.poll(max(1, int(wait * 1000) + 1)))
        if not events and alive is not None:
            try:
                gone = not alive()
            except Exception:  # noqa: BLE001 - unknown: keep waiting for the reply or the deadline
                gone = False
            if gone:
                raise ReplyRefused("was never sent: the kernel stopped")
            continue
        if shell in events:
            reply = client.get_shell_msg(timeout=0)
            if (reply.get("parent_header") or {}).get("msg_id") == msg_id:
                return reply
            continue
        if monitor is not None and monitor in events and _disconnected(monitor):
            raise ReplyRefused(f"was over {KERNEL_REPLY_MAX_BYTES:,} bytes, the grader's bound for one message "
                               "(it was refused unread)")
        if iopub in events:
            for _ in range(_IOPUB_BATCH):
                if not iopub.poll(0):
                    break
                client.get_iopub_msg(timeout=0)


class RemoteStudent:
    """The judging vocabulary (:class:`rlhf_lab.judging.core.Student`) over a kernel client.

    ``client`` is a started ``jupyter_client.BlockingKernelClient`` of the student's kernel on which
    the wire's ``bridge`` has been installed (:func:`install_bridge`); ``timeout`` is the per-cell
    timeout and ``deadline`` (a ``time.monotonic()`` instant, default ``timeout`` from now) bounds all
    the requests of one judged cell together: each waits only for the time left. When the deadline
    passes (a request still running, or a request made after it) ``interrupt()`` is called if the
    kernel was busy, :attr:`expired` becomes true and the request fails with :func:`deadline_message`.
    A reply over :data:`KERNEL_REPLY_MAX_BYTES` fails the request at once with
    :func:`too_large_message` (:func:`wait_reply`) and sets :attr:`client_broken`; when ``alive()``
    says the kernel died instead, :class:`KernelGone` is raised.
    """

    def __init__(self, client, spec, timeout: float, interrupt=None, deadline: float | None = None, alive=None):
        from rlhf_lab.judging import core

        self._client, self._spec, self._timeout, self._interrupt = client, spec, timeout, interrupt
        #: ``alive()`` is false once the kernel process is gone (``None``: not known)
        self._alive = alive
        #: true once the client lost its kernel (a refused reply): it must not be used again
        self.client_broken = False
        self.deadline = time.monotonic() + timeout if deadline is None else deadline
        self.expired = False
        #: seconds spent waiting for the kernel's answers (the student's code running), and requests made
        self.kernel_seconds, self.requests = 0.0, 0
        self._core = core

    def _time_left(self, task: str) -> float:
        """Seconds left before the cell's deadline; the deadline's failure when none are."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.expired = True
            raise self._core.GradingError(deadline_message(task, self._timeout))
        return left

    def _kernel_died(self) -> bool:
        """True when ``alive()`` turns false within :data:`GONE_GRACE` (a dead kernel disconnects
        too); false at once without ``alive``."""
        if self._alive is None:
            return False
        until = time.monotonic() + GONE_GRACE
        while True:
            try:
                if not self._alive():
                    return True
            except Exception:  # noqa: BLE001 - unknown: the refused reply is what we saw
                return False
            if time.monotonic() >= until:
                return False
            time.sleep(0.05)

    def _ask(self, text: str, task: str, what: str, program: bool = False):
        core, wire = self._core, _wire()
        left = self._time_left(task)
        asked = time.monotonic()
        try:
            shell_monitor(self._client)  # (before the request: it must see the disconnection it causes)
            msg_id = self._client.execute("", silent=True, store_history=False, allow_stdin=False,
                                          user_expressions={"r": f"_rlhf_judge_bridge({text!r})"})
            reply = wait_reply(self._client, msg_id, time.monotonic() + left, alive=self._alive)
            self.kernel_seconds += time.monotonic() - asked
            self.requests += 1
        except TimeoutError:
            if self._interrupt is not None:
                self._interrupt()
            self.expired = True
            raise core.GradingError(deadline_message(task, self._timeout)) from None
        except ReplyRefused as exc:
            self.client_broken = True
            if self._kernel_died():
                raise KernelGone("the notebook's kernel stopped while the grader was waiting for its answer") from None
            raise core.GradingError(too_large_message(task, exc)) from None
        answered, literal, detail = _expression_text(reply)
        if not answered:
            raise core.GradingError(f"{task}: the notebook's kernel could not answer the grader ({detail}); "
                                    "restart the kernel and run the notebook from the top")
        try:  # nothing is parsed before its size is known (wire.read_text, wire.response)
            limit = wire.MAX_PROGRAM_LITERAL_CHARS if program else wire.MAX_LITERAL_CHARS
            ok, payload = wire.response(wire.read_text(literal, limit), program=program)
        except wire.TooLarge as exc:
            raise core.GradingError(too_large_message(task, exc)) from None
        except (ValueError, TypeError, MemoryError, RecursionError, wire.Refused) as exc:
            raise core.GradingError(f"{task}: the kernel's answer could not be read ({exc})") from None
        if not ok:
            kind, error = payload
            if kind == "missing":
                raise core.GradingError(f"{task}: `{error}` is not defined: run the cell that defines it "
                                        "(restart the kernel and run the notebook from the top)")
            if kind == "untraceable":
                raise core.GradingError(core.untraceable_message(task, error))
            if kind == "refused":
                raise core.GradingError(f"{what}: expected numbers or arrays (or a tuple/dict of them), got {error}")
            raise core.GradingError(f"{task}: your function raised {error}")
        if program:
            value, body = payload
            return core.plain(value, what), body
        return core.plain(payload, what)

    def call(self, name: str, *args, **kwargs):
        return self._ask(_wire().request("call", name, args, kwargs), name, f"{name}: its result")

    def grad(self, name: str, argnums, *args, **kwargs):
        """The gradient of ``name`` with respect to ``argnums``, computed here: the kernel sends the value of
        the call and the program the function traces to (:func:`rlhf_lab.judging.wire.trace`), and this
        process rebuilds that program with its own JAX and differentiates it
        (:func:`rlhf_lab.judging.program.judge_gradient`). Nothing the kernel computes is taken as a
        gradient."""
        from rlhf_lab.judging import program

        value, body = self._ask(_wire().request("trace", name, args, kwargs, argnums=argnums), name,
                                f"{name}: its result", program=True)
        return program.judge_gradient(name, value, body, self._core.unwrap(args), argnums)

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


def connect_judge_client(connection_info: dict, timeout: float):
    """A new client of the kernel at ``connection_info`` (its sockets bounded, :func:`bounded_context`),
    ready (``wait_for_ready``: the kernel answered and its output channel is connected);
    :class:`KernelGone` when the kernel does not answer within ``timeout``. The bridge is not
    installed here: :meth:`JudgeCells._client_for_judge` installs it at the judged cell."""
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(context=bounded_context())
    client.load_connection_info(connection_info)
    client.start_channels()
    try:
        client.wait_for_ready(timeout=timeout)
    except (RuntimeError, TimeoutError) as exc:
        close_client(client)
        raise KernelGone(f"the notebook's kernel did not answer the grader ({exc})") from None
    return client


def close_client(client) -> None:
    """Stop ``client``'s channels and destroy its ZeroMQ context (never raises)."""
    try:
        close_shell_monitor(client)
        client.stop_channels()
        client.context.destroy(linger=0)
    except Exception:  # noqa: BLE001
        pass


class PendingClient:
    """:func:`connect_judge_client` running in a daemon thread from construction; :meth:`take` hands
    its client over to the calling thread (the thread has ended by then, so its sockets are the
    caller's from there on) and :meth:`discard` closes whatever it made."""

    def __init__(self, connection_info: dict, timeout: float):
        self._client = None
        self._lock = threading.Lock()
        self._discarded = False
        self._thread = threading.Thread(target=self._run, args=(connection_info, timeout),
                                        name="judge-client", daemon=True)
        self._thread.start()

    def _run(self, connection_info, timeout) -> None:
        try:
            client = connect_judge_client(connection_info, timeout)
        except Exception:  # noqa: BLE001 - the judged cell connects again and reports
            return
        with self._lock:
            if self._discarded:
                close_client(client)
            else:
                self._client = client

    def take(self, timeout: float):
        """The connected client, waiting up to ``timeout`` s for the thread; ``None`` when it failed
        or is still connecting (then it is discarded)."""
        self._thread.join(timeout)
        with self._lock:
            client, self._client = self._client, None
            if client is None:
                self._discarded = True
        return client

    def discard(self) -> None:
        """Close the client (now, or when the thread finishes making it)."""
        with self._lock:
            self._discarded = True
            client, self._client = self._client, None
        if client is not None:
            close_client(client)


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
#: Where this process's checks keep their compiled XLA programs (:func:`use_compile_cache`); empty: nowhere.
_COMPILE_CACHE: list = []
#: The grader's own compilation cache, under the course root.
GRADER_CACHE_DIR = os.path.join(".cache", "jax-grader")


def use_compile_cache(root) -> str | None:
    """Keep the XLA programs this process's checks compile in ``<root>/.cache/jax-grader/``, so the
    next grader process (the next student's ``nbgrader autograde``, the next class run's judge
    server) loads them instead of compiling the references again. Returns the folder, or ``None``
    when switched off (``RLHF_COMPILE_CACHE=0``, or ``RLHF_NO_SANDBOX=1``).

    The folder is written and read by grader processes only: a grading kernel never sees
    the course root (the sandbox binds its scratch folder and library build alone), so nothing a student runs can plant a program a check later loads. Without the sandbox
    the kernel runs as the grader, inside the course, and could: then there is no such cache.
    Takes effect at the first check of the process (before JAX compiles anything for it).

    XLA logs C++ lines on every cache read (a warning each, and on CPUs with AVX-512 two ERROR lines
    per entry, see ``compile_cache.CACHE_SETTINGS``), on the instructor's terminal and in every
    autograde log. Its level is read when JAX loads, so this sets ``TF_CPP_MIN_LOG_LEVEL=3`` (fatal
    lines only, as for the kernels; a real failure is still a Python exception) and must be called
    before: in a process that loaded JAX with another level there is no cache (``nbgrader_config.py``
    calls it before anything imports JAX; a class run's judge server compiles once per run anyway)."""
    quiet = os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "3" or "jaxlib" not in sys.modules
    if (os.environ.get("RLHF_COMPILE_CACHE", "1") == "0" or not quiet
            or os.environ.get("RLHF_NO_SANDBOX", "") in ("1", "true", "yes")):
        _COMPILE_CACHE.clear()
        return None
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    folder = os.path.join(os.path.abspath(os.fspath(root)), GRADER_CACHE_DIR)
    _COMPILE_CACHE[:] = [folder]
    return folder


def _configure_compile_cache() -> None:
    """Point JAX's persistent cache at :func:`use_compile_cache`'s folder (once, before any compile)."""
    if not _COMPILE_CACHE or _COMPILE_CACHE[0] is None:
        return
    folder, _COMPILE_CACHE[0] = _COMPILE_CACHE[0], None
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        import jax

        jax.config.update("jax_compilation_cache_dir", folder)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    except Exception:  # noqa: BLE001 - no cache only costs time
        pass


def _reference():
    """The course library's reference functions in this process (built once per process)."""
    if not _REFERENCE:
        _configure_compile_cache()
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


#: Bounds of one message between a grader process and the judge server, checked before it is parsed
#: (``recv_bytes(maxlength)``, then :func:`rlhf_lab.judging.wire.scan`): a check's request (the largest
#: measured on the correct example submissions: 3,679 characters, 92 nodes) or a kernel's answer encoded
#: again (at most ``wire.MAX_RESPONSE_CHARS`` = 32,768 characters and ``wire.MAX_RESPONSE_NODES`` = 2,048
#: nodes, as it was read from the kernel). A larger message ends the connection (the grader process then
#: judges by itself).
LINK_MAX_BYTES = 1024 * 1024
LINK_MAX_NODES = 4_096
#: A message is a JSON list around wire nodes: two levels over the nodes' own.
LINK_MAX_DEPTH = 2 * 8 + 3 + 2


def _argument(node, depth: int = 0):
    """A request argument back from its wire node (:func:`rlhf_lab.judging.wire.encode_argument`): plain
    data, with the markers :class:`~rlhf_lab.judging.core.Jax`, ``Key`` and ``Source`` rebuilt as
    those objects (not as live JAX values: the kernel builds those)."""
    from rlhf_lab.judging import core

    wire = _wire()
    if depth > wire.MAX_DEPTH:
        raise wire.Refused("nested too deeply")
    t = node.get("t") if type(node) is dict else None
    if t in ("tuple", "list") and type(node.get("v")) is list:
        items = [_argument(v, depth + 1) for v in node["v"]]
        return tuple(items) if t == "tuple" else items
    if t == "dict" and type(node.get("v")) is dict:
        return {str(k): _argument(v, depth + 1) for k, v in node["v"].items()}
    if t == "jax":
        return core.Jax(wire.decode(node.get("v"), depth=depth + 1))
    if t == "key" and type(node.get("seed")) is int:
        return core.Key(node["seed"])
    if t == "src" and type(node.get("source")) is str and type(node.get("name")) is str:
        return core.Source(node["source"], node["name"])
    return wire.decode(node, depth=depth)


def link_encode(message: tuple) -> bytes:
    """One message of the judge-server connection as bytes: a JSON list whose values are wire nodes
    (``("ok", value)`` and ``("ask", method, args, kwargs)``) or plain strings, numbers and ``None``;
    :class:`rlhf_lab.judging.wire.Refused` for a value that is not plain data."""
    wire = _wire()
    kind = message[0]
    if kind == "ok":
        body = ["ok", wire.encode(message[1])]
    elif kind == "ask":
        _, method, args, kwargs = message
        body = ["ask", method, [wire.encode_argument(a) for a in args],
                {k: wire.encode_argument(v) for k, v in kwargs.items()}]
    else:
        body = list(message)
    return json.dumps(body).encode("ascii")


def link_decode(data: bytes) -> tuple:
    """A message of the judge-server connection back from its bytes (at most :data:`LINK_MAX_BYTES`):
    counted (:data:`LINK_MAX_NODES`, :data:`LINK_MAX_DEPTH`) before it is parsed, then only plain
    data and the argument markers are built. Raises ``ValueError`` or ``wire.Refused``."""
    wire = _wire()
    if len(data) > LINK_MAX_BYTES:
        raise wire.TooLarge(f"is {len(data):,} bytes long; at most {LINK_MAX_BYTES:,} are read")
    text = data.decode("ascii")
    wire.scan(text, LINK_MAX_NODES, LINK_MAX_DEPTH)
    body = json.loads(text)
    if type(body) is not list or not body or type(body[0]) is not str:
        raise wire.Refused("not a message")
    kind, rest = body[0], body[1:]
    try:
        if kind == "ok" and len(rest) == 1:
            return ("ok", wire.decode(rest[0]))
        if kind == "ask" and len(rest) == 3 and type(rest[1]) is list and type(rest[2]) is dict:
            return ("ask", rest[0], tuple(_argument(a) for a in rest[1]),
                    {str(k): _argument(v) for k, v in rest[2].items()})
    except (KeyError, TypeError, AttributeError, IndexError, OverflowError) as exc:
        raise wire.Refused(f"a malformed node ({type(exc).__name__})") from None
    if kind not in ("ok", "ask") and all(v is None or type(v) in (str, int) for v in rest):
        return (kind, *rest)
    raise wire.Refused(f"an unexpected message {kind[:40]!r}")


def link_send(conn, message: tuple) -> None:
    """Send one message (:func:`link_encode`) over a ``multiprocessing.connection`` connection."""
    conn.send_bytes(link_encode(message))


def link_recv(conn) -> tuple:
    """Receive one message: at most :data:`LINK_MAX_BYTES` are read (``OSError`` beyond, before the
    body is read), then :func:`link_decode`; nothing is unpickled."""
    return link_decode(conn.recv_bytes(LINK_MAX_BYTES))


class ServerLink:
    """The connection of one grader process to a judge server (see the module docstring).

    Messages (JSON of plain data and wire nodes, :func:`link_encode`, over an authenticated Unix
    socket; each at most :data:`LINK_MAX_BYTES`): we send ``("judge", PROTOCOL, grade_id)``;
    the server sends ``("ask", method, args, kwargs)`` any number of times, each answered with
    ``("ok", plain_value)``, ``("fail", message)`` (the request raised :class:`GradingError`, for
    example a timeout) or ``("abort",)`` (anything else, such as :class:`KernelGone`, which is then
    raised here once the server said ``("aborted",)``); finally ``("verdict", None | message)`` or
    ``("crashed", exception_name, text)``. ``wait`` bounds each wait for the server (seconds); with a
    cell's deadline, the verdict must also come by then plus :attr:`margin` (:class:`DeadlineExceeded`).
    """

    #: Seconds the server may take past a cell's deadline (to decide once the last request failed).
    margin = 5.0

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

    def _recv(self, limit: float | None = None):
        """The server's next message; :class:`DeadlineExceeded` when none came by ``limit`` (a
        ``time.monotonic()`` instant), :class:`ServerUnavailable` when none came within :attr:`wait`."""
        conn = self._conn
        wait = self.wait if limit is None else min(self.wait, limit - time.monotonic())
        try:
            if not conn.poll(max(wait, 0.0)):
                if limit is not None and time.monotonic() >= limit:
                    raise DeadlineExceeded(f"no verdict within the cell's deadline and {self.margin:g} s")
                raise ServerUnavailable(f"no answer within {self.wait:g} s")
            return link_recv(conn)
        except (OSError, EOFError) as exc:
            raise ServerUnavailable(f"the connection was lost ({type(exc).__name__}: {exc})") from None
        except (ServerUnavailable, DeadlineExceeded):
            raise
        except Exception as exc:  # noqa: BLE001 - an unreadable message
            raise ServerUnavailable(f"unreadable message ({type(exc).__name__}: {str(exc)[:200]})") from None

    def _send(self, message) -> None:
        data = message if isinstance(message, bytes) else link_encode(message)
        try:
            self._conn.send_bytes(data)
        except (OSError, EOFError, ValueError) as exc:
            raise ServerUnavailable(f"the connection was lost ({type(exc).__name__})") from None

    def _answer(self, student, method: str, args: tuple, kwargs: dict):
        """``(reply, pending)`` for one request of the server: the encoded plain answer, the check's
        failure, or an abort and the exception to raise once the server stopped the check."""
        from rlhf_lab.judging import core

        try:
            reply = ("ok", getattr(student, method)(*args, **kwargs))
        except core.GradingError as exc:
            return ("fail", str(exc)), None
        except Exception as exc:  # noqa: BLE001 - raised here once the server stopped the check
            return ("abort",), exc
        try:
            return link_encode(reply), None
        except _wire().Refused as exc:
            return ("fail", f"{method}: the answer is not plain data ({exc})"), None

    def judge(self, name: str, student, deadline: float | None = None) -> list:
        """The outputs of the check ``name`` (as :func:`run_check`), decided by the server, each of its
        requests answered by ``student``. With ``deadline`` (``time.monotonic()``) the verdict must come
        by then (or by ``student.deadline`` when that moved later) plus :attr:`margin`. Raises :class:`ServerUnavailable` (judge locally then),
        :class:`DeadlineExceeded` (the cell failed; the connection is closed), :class:`CheckCrashed`, or
        whatever ``student`` raised other than a ``GradingError``."""
        try:
            self._connection()
            self._send(("judge", PROTOCOL, name))
            pending = None
            while True:
                limit = None if deadline is None else max(deadline, getattr(student, "deadline", deadline)) + self.margin
                message = self._recv(limit)
                kind = message[0]
                if kind == "ask" and message[1] in STUDENT_METHODS and pending is None:
                    reply, pending = self._answer(student, *message[1:])
                    self._send(reply)
                elif kind == "aborted" and len(message) == 1 and pending is not None:
                    raise pending
                elif kind == "verdict" and len(message) == 2 and (message[1] is None or isinstance(message[1], str)):
                    return [] if message[1] is None else [error_output(message[1])]
                elif kind == "crashed" and len(message) == 3:
                    raise CheckCrashed(str(message[1]), str(message[2]))
                else:
                    raise ServerUnavailable(f"unexpected message {str(message)[:80]!r}")
        except (ServerUnavailable, DeadlineExceeded):
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None


class JudgeCells:
    """Mixin for nbgrader's ``Execute``: judged test cells are decided here, not run in the kernel.

    ``nbgrader_config.py`` builds ``class Execute(JudgeCells, kernel_guard.Execute)``. A judged cell has
    one deadline, the per-cell timeout from the moment the grader's bridge is ready: every request of its
    check waits only for the time left, and the server's verdict must come by then (plus
    :attr:`ServerLink.margin`); past it the kernel is interrupted and the cell fails with
    :func:`deadline_message`. A kernel that is gone stops the notebook like a dead kernel does in
    :mod:`.kernel_guard` (later cells are marked not run).
    """

    _judge_client = None
    _judge_km = None
    _judge_link = None
    _judge_link_broken = False
    _judge_pending = None
    _judge_pending_km = None
    _judge_prepared_for = None

    def create_kernel_manager(self):
        """The kernel manager, told that the judge decides this notebook's tests (the sandbox then gives
        the kernel the library build without the functions the notebook asks students to write)."""
        km = super().create_kernel_manager()
        if km.has_trait("judged"):
            km.judged = True
        return km

    def preprocess_cell(self, cell, resources, index):
        name = judged_check(cell)
        if name is None or getattr(self, "_stopped", None) is not None:
            self._prepare_judge_client()
            return super().preprocess_cell(cell, resources, index)
        from rlhf_lab.instructor.grader import timeline

        with timeline.phase("judged cell", index=index, grade_id=name) as fields:
            return self._judge_cell(cell, resources, index, name, fields)

    def _judge_cell(self, cell, resources, index, name: str, fields: dict):
        """Decide the judged test cell ``name`` (see the class docstring); ``fields`` gets its timings
        for the timeline."""
        timeout = float(getattr(self, "timeout", None) or os.environ.get("RLHF_CELL_TIMEOUT", 60))
        spec = self._spec_or_stub(name)
        try:
            started = time.monotonic()
            client = self._client_for_judge(timeout)  # start-up: not counted against the student
            deadline = time.monotonic() + timeout
            student = RemoteStudent(client, spec, timeout, interrupt=self._interrupt_for_judge, deadline=deadline,
                                    alive=self._kernel_alive)
            try:
                outputs = self._decide(name, student, deadline)
            finally:
                if student.client_broken:  # ZeroMQ does not reconnect it: the next judged cell gets a new one
                    self._close_judge_client()
            fields.update(client_start=round(deadline - timeout - started, 3),
                          kernel=round(student.kernel_seconds, 3), requests=student.requests)
            # a check that carried on after its request ran out of time still fails on the deadline
            cell.outputs = [error_output(deadline_message(spec.task, timeout))] if student.expired else outputs
        except DeadlineExceeded as exc:
            self.log.warning("judging %s: %s", name, exc)
            cell.outputs = [error_output(deadline_message(spec.task, timeout))]
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

    def _decide(self, name: str, student, deadline: float | None = None) -> list:
        """The check's outputs: from this run's judge server when there is one (its verdict due by
        ``deadline`` plus the link's margin), else from this process."""
        link = self._link()
        if link is not None:
            started = time.monotonic()
            try:
                return link.judge(name, student, deadline)
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

    def _prepare_judge_client(self) -> None:
        """At a notebook's first cell, connect the judge's client to the kernel in a background thread
        (:func:`connect_judge_client`) when the notebook has a judged cell: its 0.3-0.5 s of start-up
        (ZeroMQ connections, the kernel's first reply, the quiet output channel ``wait_for_ready``
        waits for) then overlaps the notebook's own cells instead of delaying the first judged cell;
        the bridge is still installed at that cell. Once per kernel; the first judged cell waits for it
        (:meth:`_client_for_judge`), and a failure there only means it connects again there."""
        km = getattr(self, "km", None)
        if km is None or self._judge_prepared_for is km:  # decided once per kernel, not per cell
            return
        self._judge_prepared_for = km
        cells = (getattr(self, "nb", None) or {}).get("cells", [])
        if self._judge_km is km or not any(judged_check(c) for c in cells):
            return
        self._drop_pending_judge_client()
        timeout = float(getattr(self, "timeout", None) or os.environ.get("RLHF_CELL_TIMEOUT", 60))
        pending = PendingClient(km.get_connection_info(), timeout)
        self._judge_pending, self._judge_pending_km = pending, km

    def _client_for_judge(self, timeout: float):
        km = getattr(self, "km", None)
        if km is None:
            raise KernelGone("the notebook's kernel is not running")
        if self._judge_km is not km or self._judge_client is None:
            self._close_judge_client()
            client = None
            pending = getattr(self, "_judge_pending", None)
            if pending is not None and self._judge_pending_km is km:
                self._judge_pending = self._judge_pending_km = None
                client = pending.take(timeout)  # None: it failed or did not finish in time; connect again
            if client is None:
                client = connect_judge_client(km.get_connection_info(), timeout)
            try:  # at the first judged cell, as it always was: after the cells above it ran
                install_bridge(client, timeout)
            except (RuntimeError, TimeoutError, KernelGone) as exc:
                close_client(client)
                raise KernelGone(f"the notebook's kernel did not answer the grader ({exc})") from None
            self._judge_client, self._judge_km = client, km
        return self._judge_client

    def _drop_pending_judge_client(self) -> None:
        pending = getattr(self, "_judge_pending", None)
        self._judge_pending = self._judge_pending_km = None
        if pending is not None:
            pending.discard()

    def _kernel_alive(self) -> bool:
        """Whether the notebook's kernel process still runs (true when that cannot be told)."""
        km = getattr(self, "km", None)
        if km is None:
            return False
        from jupyter_core.utils import run_sync

        return bool(run_sync(km.is_alive)())

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
            close_client(self._judge_client)
        self._judge_client, self._judge_km = None, None

    def preprocess(self, nb, resources=None, km=None):
        try:
            return super().preprocess(nb, resources, km)
        finally:
            self._drop_pending_judge_client()
            self._close_judge_client()
            self._close_judge_link()
