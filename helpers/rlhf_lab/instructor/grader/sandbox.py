"""Grading kernels in a bubblewrap sandbox (selected for autograding in ``nbgrader_config.py``).

:class:`SandboxedKernelManager` is :class:`.kernel_guard.LimitedKernelManager` (same rlimits,
process-group kill, private JAX compilation cache) whose kernel process is started by ``bwrap``
(Debian/Ubuntu package ``bubblewrap``) so student code sees almost nothing of the machine:

* **processes**: its own PID namespace (``--unshare-pid``) and ``--die-with-parent``; when the
  kernel stops, the manager kills ``bwrap``, which takes the namespace's init with it, and the
  kernel tears down every process of the namespace, including ones that called ``setsid``, forked
  twice or used ``nohup``. A process limit holds inside the sandbox (``RLIMIT_NPROC``, see below).
* **network**: none (``--unshare-net``: only a loopback interface that is down). The kernel talks
  to the grader over Jupyter's IPC transport: ZeroMQ Unix sockets in a private folder that only
  that kernel and the grader can use.
* **files**: a private ``/tmp`` (tmpfs of at most :meth:`SandboxedKernelManager.tmp_limit_mb` MiB,
  taken from the kernel's memory budget: RLIMIT_AS is lowered by the same amount) as ``HOME``;
  read-only: ``/usr`` (``/usr/local`` hidden), the dynamic linker's, name service's and
  fontconfig's files of ``/etc`` (so matplotlib finds its fonts without a word on stderr) and the
  system font cache, the Python environment (the venv and the base interpreter it points to) and the course
  library BUILD for the notebook being graded (:mod:`.library_build`, mounted where the installed
  library lives); writable: the kernel's SCRATCH working folder, its IPC folder and its private
  compile-cache copy. Nothing else exists in the sandbox: not the gradebook, ``source/``,
  ``release/``, ``submitted/``, other students' folders, the instructor's home, ``.git`` or the rest
  of the repository.
* **scratch working folder**: the notebook's real folder (``autograded/<student>/<assignment>/``)
  is never mounted in the sandbox. Before the kernel starts, its regular files and folders are
  copied (:func:`copy_regular_tree`: links, FIFOs, sockets and devices are skipped with a log line
  naming the student and the file; at most ``scratch_copy_mb`` MiB) into a new folder of the grader
  (:class:`Scratch`, mode 0700, on disk, outside the course), which is bound AT THE REAL FOLDER'S
  PATH inside the sandbox: the kernel's working directory and relative paths are unchanged. nbgrader
  then writes the executed notebook (from memory) into the real folder, which no kernel could
  touch: whatever the kernel left in its folder (links, FIFOs, sparse files) is deleted with the
  scratch when the kernel stops, without following links. Scratch folders of a grader that was
  killed are swept by the next kernel start (their lock is free).
* **identity**: when the grader runs as root, the kernel runs as an unprivileged user id of its
  own (``uid_base`` + a slot held while the kernel lives) with no capabilities and no way to gain
  any (bubblewrap sets ``no_new_privs``); the scratch is handed to that id (the real notebook
  folder never is). ``RLIMIT_NPROC`` is not enforced for root (the kernel
  exempts uid 0 even inside a user namespace), which is why the kernel must not run as root.
  For a grader that is not root, bubblewrap runs unprivileged in a new user namespace, where the
  same limit counts only the sandbox's processes.

Without a working ``bwrap`` (not installed, or its self-test fails, e.g. user namespaces are
disabled) the manager REFUSES to start a kernel (:class:`SandboxUnavailable`, with install
instructions), unless the instructor opts out: ``RLHF_NO_SANDBOX=1`` or
``c.SandboxedKernelManager.no_sandbox = True``. Then kernels run as before (rlimits only, in the
real notebook folder, no scratch, no bounded ``/tmp``) and a loud warning says, once per process,
that grades are not protected.
"""
from __future__ import annotations

import atexit
import fcntl
import functools
import importlib.util
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from traitlets import Bool, CaselessStrEnum, Integer, Unicode, default


def _sibling(filename: str, name: str):
    """Load a module of this folder by file path (importing ``rlhf_lab`` would import JAX)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), filename))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_kernel_guard = _sibling("kernel_guard.py", "rlhf_lab_course_kernel_guard")
LimitedKernelManager = _kernel_guard.LimitedKernelManager

NO_SANDBOX_ENV = "RLHF_NO_SANDBOX"
#: Set by a parent (the course command) that already printed the unprotected-grading warning.
WARNED_ENV = "RLHF_NO_SANDBOX_WARNED"
INSTALL_HINT = (
    "Install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install "
    "bubblewrap`) and make sure user namespaces are enabled (`sysctl user.max_user_namespaces` must be "
    "> 0; on Debian/Ubuntu also `sudo sysctl kernel.unprivileged_userns_clone=1`, and on Ubuntu 24.04+ "
    "an AppArmor profile that allows bwrap to use them). To grade WITHOUT protection anyway, set "
    f"{NO_SANDBOX_ENV}=1 (the course command's --no-sandbox)."
)
UNPROTECTED_WARNING = (
    "\n" + "!" * 78 + "\n"
    "!!  GRADES ARE NOT PROTECTED: kernels run WITHOUT the sandbox (" + NO_SANDBOX_ENV + "=1).\n"
    "!!  Student code can read and write the gradebook, source/ (hidden tests), other students'\n"
    "!!  folders and the course library, open network connections and leave processes behind.\n"
    + "!" * 78
)
#: /etc entries the interpreter and the C library need (nothing else of /etc is visible).
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd", "group", "nsswitch.conf",
             "hosts", "host.conf", "mime.types", "fonts", "ssl/openssl.cnf")
#: fontconfig's system cache (``<cachedir>`` of ``/etc/fonts/fonts.conf``), bound read-only when it exists.
FONT_CACHE = "/var/cache/fontconfig"
#: Environment variables a kernel keeps (prefixes); everything else of the grader's environment
#: (database URLs, tokens, paths to the course) is dropped.
ENV_KEEP_PREFIXES = ("JAX_", "XLA_", "TF_CPP_", "NBGRADER_", "PYDEVD_", "LANG", "LC_", "OMP_", "OPENBLAS_",
                     "MKL_", "TZ", "TERM", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONUNBUFFERED",
                     "PYTHONIOENCODING", "MPLBACKEND", "COLUMNS", "CLICOLOR", "FORCE_COLOR", "NO_COLOR")

#: Name prefix of the kernels' scratch folders, and the lock file a live one's grader holds.
SCRATCH_PREFIX = "rlhf-scratch-"
SCRATCH_LOCK = "held.lock"
#: Most files and folders copied from a notebook folder into its scratch.
SCRATCH_MAX_ENTRIES = 10_000
#: A scratch folder whose lock is free is swept only when it is older than this (s): a grader
#: that is still creating one has not taken its lock yet.
SCRATCH_SWEEP_AGE = 60.0
#: Largest private /tmp (MiB) when not configured: min(this, memory limit / 8).
TMP_DEFAULT_MB = 512

# Runs inside the sandbox as the kernel's first process, before ipykernel: drops root for the
# kernel's own user id, sets the process limit, restores SIGINT (ignored by bwrap so that an
# interrupt reaches the kernel without killing the sandbox) and becomes the kernel.
_WRAPPER = """\
import os, resource, signal, sys
uid, nproc = int(sys.argv[1]), int(sys.argv[2])
if uid >= 0:
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
if nproc > 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execv(sys.argv[3], sys.argv[3:])
"""


#: Text of a source notebook whose hidden tests still decide inside the kernel with the library's
#: reference functions (and the checks of ``rlhf_lab.judging``): such notebooks get a full build.
IN_KERNEL_MARKERS = ("grading.start(", "grading.reference", "grading.judge(")


class SandboxUnavailable(RuntimeError):
    """Grading refused: no working sandbox and no opt-out."""


def _flag(value: str | None) -> bool:
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


def opted_out(env=None) -> bool:
    """True when ``RLHF_NO_SANDBOX`` asks for unsandboxed grading."""
    env = os.environ if env is None else env
    return _flag(env.get(NO_SANDBOX_ENV))


def find_bwrap(path: str | None = None) -> str | None:
    """The ``bwrap`` executable on ``path`` (default ``$PATH``), or None."""
    return shutil.which("bwrap", path=path)


@functools.lru_cache(maxsize=8)
def self_test(bwrap: str) -> str | None:
    """Run a minimal sandbox once; None if it works, else the problem (cached per process)."""
    if not bwrap or not os.path.isfile(bwrap):
        raise ValueError(f"bwrap must be the path of an executable file, got {bwrap!r}")
    cmd = [bwrap, "--unshare-pid", "--unshare-net", "--die-with-parent", "--ro-bind", "/", "/",
           "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "true"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} could not run: {exc}"
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return f"{bwrap} failed its self-test ({detail})"
    return None


def availability(path: str | None = None) -> tuple[str | None, str | None]:
    """``(bwrap path, None)`` when the sandbox works, else ``(None, problem)``."""
    bwrap = find_bwrap(path)
    if bwrap is None:
        return None, "bwrap (bubblewrap) is not installed or not on PATH"
    problem = self_test(bwrap)
    return (None, problem) if problem else (bwrap, None)


def refusal_message(problem: str) -> str:
    """The message grading stops with when there is no sandbox."""
    return (f"Refusing to grade: the kernel sandbox is not available: {problem}. Student code must run "
            f"isolated from the gradebook, the hidden tests and other students. {INSTALL_HINT}")


_warned = False


def warn_unprotected(log=None) -> bool:
    """Print :data:`UNPROTECTED_WARNING` once per process (and not at all if a parent set
    ``RLHF_NO_SANDBOX_WARNED=1`` after printing it); returns whether it printed now."""
    global _warned
    if _warned or _flag(os.environ.get(WARNED_ENV)):
        return False
    _warned = True
    if log is not None:
        log.warning(UNPROTECTED_WARNING)
    else:
        print(UNPROTECTED_WARNING, file=sys.stderr, flush=True)
    return True


def check_grading_allowed(env=None, path: str | None = None, log=None) -> str | None:
    """For the course command, before a class run: raise :class:`SandboxUnavailable` when grading
    would be refused, warn once and return ``"unprotected"`` when opted out, else return None."""
    if opted_out(env):
        warn_unprotected(log)
        return "unprotected"
    bwrap, problem = availability(path)
    if bwrap is None:
        raise SandboxUnavailable(refusal_message(problem))
    return None


# --- the bwrap command --------------------------------------------------------------------------

def python_roots() -> list[str]:
    """Folders of this Python environment: the venv and the base installation it points to."""
    roots = []
    for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))):
        p = os.path.realpath(p)
        if p not in roots and p not in ("/", "/usr"):
            roots.append(p)
    venv_python = os.path.join(sys.prefix, "bin", "python")
    if os.path.islink(venv_python):
        target = os.path.dirname(os.path.dirname(os.path.realpath(venv_python)))
        if target not in roots and target not in ("/", "/usr"):
            roots.append(target)
    return roots


def _ancestors(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]


def bwrap_command(bwrap: str, kernel_cmd: list[str], *, cwd: str, scratch: str, readonly: list[tuple[str, str]],
                  writable: list[str], uid: int, nproc: int, python: str, tmp_bytes: int = 0) -> list[str]:
    """The full command line that runs ``kernel_cmd`` in the sandbox (a pure function).

    ``cwd``: the notebook folder's path, the kernel's working directory inside; ``scratch``: the
    host folder mounted (writable) there, never ``cwd`` itself; ``readonly``: ``(host path,
    sandbox path)`` pairs; ``writable``: host paths mounted at the same path; ``uid``: the kernel's
    user id (``-1``: keep the caller's); ``nproc``: RLIMIT_NPROC (``0``: none); ``python``: the
    interpreter that runs the small launcher inside; ``tmp_bytes``: size of the private ``/tmp``
    (``0``: tmpfs default, half the machine's memory).
    """
    if not kernel_cmd:
        raise ValueError("kernel_cmd must be a non-empty list of arguments")
    if not os.path.isabs(cwd) or not os.path.isabs(scratch):
        raise ValueError(f"cwd and scratch must be absolute paths, got {cwd!r} and {scratch!r}")
    if os.path.normpath(scratch) == os.path.normpath(cwd) or cwd in writable:
        raise ValueError(f"the notebook folder {cwd} must not be mounted writable: bind a scratch copy")
    if nproc < 0:
        raise ValueError(f"nproc must be >= 0 (0: no limit), got {nproc}")
    if tmp_bytes < 0:
        raise ValueError(f"tmp_bytes must be >= 0 (0: tmpfs default), got {tmp_bytes}")
    cmd = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--hostname", "grading-sandbox"]
    cmd += ["--ro-bind", "/usr", "/usr", "--tmpfs", "/usr/local"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    # /etc itself first, mode 0755: made implicitly for the first bind below, it would be 0700 and the
    # kernel's own user id could open nothing in it (fontconfig then writes "Fontconfig error: Cannot
    # load default config file" into the output of every cell that first uses matplotlib)
    cmd += ["--perms", "0755", "--dir", "/etc"]
    for name in ETC_FILES:
        cmd += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    # the system's font cache, read-only (fontconfig would otherwise rescan every font in every kernel)
    for folder in ("/var", "/var/cache"):
        cmd += ["--perms", "0755", "--dir", folder]
    cmd += ["--ro-bind-try", FONT_CACHE, FONT_CACHE]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777"]
    if tmp_bytes:
        cmd += ["--size", str(tmp_bytes)]
    cmd += ["--tmpfs", "/tmp"]
    made: set[str] = {"/usr", "/tmp", "/proc", "/dev", "/etc", "/var", "/var/cache"}
    targets = [dest for _, dest in readonly] + list(writable) + [cwd]
    for target in targets:
        for folder in _ancestors(target):
            # folders bwrap would create for a mount point get mode 0700, which the kernel's
            # own user id could not traverse; /usr itself is the host's (bound read-only)
            inside_usr = folder.startswith("/usr/") and not (folder + "/").startswith("/usr/local/")
            if folder not in made and not inside_usr and not folder.startswith(("/proc/", "/dev/")):
                made.add(folder)
                cmd += ["--perms", "0755", "--dir", folder]
    for src, dest in readonly:
        cmd += ["--ro-bind", src, dest]
    for path in writable:
        cmd += ["--bind", path, path]
    cmd += ["--bind", scratch, cwd]
    # jupyter_client sets JPY_PARENT_PID to the grader's pid, which does not exist in the PID
    # namespace (ipykernel would shut down at once); 1 (the namespace's init, the kernel's real
    # parent) switches ipykernel's parent polling off: --die-with-parent does that job
    cmd += ["--setenv", "JPY_PARENT_PID", "1", "--chdir", cwd]
    if uid >= 0:
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    cmd += ["--", python, "-I", "-S", "-c", _WRAPPER, str(uid), str(nproc), *kernel_cmd]
    return cmd


def library_pythonpath(env=None) -> str | None:
    """The one folder a sandboxed Python needs on ``PYTHONPATH`` to import the course library: the
    parent of ``rlhf_lab``'s package when the grader itself has that parent on ``PYTHONPATH`` (the
    hub's servers run a venv without the course library; the hub hands the instructor's copy through
    ``PYTHONPATH``). ``None`` when the library is installed in the venv (its ``.pth``), which the
    sandbox's Python finds by itself. Nothing else of the grader's ``PYTHONPATH`` is ever passed on:
    the library is bound (read-only) at that same path inside the sandbox."""
    env = os.environ if env is None else env
    try:
        parent = os.path.dirname(_installed_library_dir())
    except SandboxUnavailable:
        return None
    entries = {os.path.realpath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p}
    return parent if parent in entries else None


def sandbox_env(env: dict, home: str = "/tmp") -> dict:
    """The kernel's environment: :data:`ENV_KEEP_PREFIXES` of ``env``, a PATH inside the sandbox,
    ``HOME``/``TMPDIR`` on the private ``/tmp``, and ``PYTHONPATH`` only when the course library
    comes from it (:func:`library_pythonpath`)."""
    out = {k: v for k, v in env.items() if k.startswith(ENV_KEEP_PREFIXES)}
    library = library_pythonpath(env)
    if library:
        out["PYTHONPATH"] = library
    out.update(HOME=home, TMPDIR="/tmp", USER="student", LOGNAME="student",
               PATH=os.pathsep.join([os.path.join(sys.prefix, "bin"), "/usr/bin", "/bin"]),
               MPLCONFIGDIR="/tmp/.matplotlib", IPYTHONDIR="/tmp/.ipython", JUPYTER_RUNTIME_DIR="/tmp/.jupyter")
    return out


# --- kernel user ids -----------------------------------------------------------------------------

class UidSlot:
    """An unprivileged user id for one kernel, held (``flock``) until :meth:`release`.

    Each concurrent kernel gets its own id, so one sandbox's processes never count against
    another's process limit. A lock dies with the grader that held it.
    """

    def __init__(self, base: int, span: int = 4096, lock_dir: str | None = None):
        if not 1000 <= base <= 2 ** 31 - span - 1:
            raise ValueError(f"uid_base must be in [1000, {2 ** 31 - span - 1}], got {base}")
        lock_dir = lock_dir or os.path.join(tempfile.gettempdir(), "rlhf-sandbox-uids")
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        self.fd = None
        self.uid = -1
        start = os.getpid() % span
        for i in range(span):
            slot = (start + i) % span
            fd = os.open(os.path.join(lock_dir, f"{base + slot}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.fd, self.uid = fd, base + slot
            return
        raise SandboxUnavailable(f"all {span} sandbox user ids from {base} are in use")

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _chown_tree(root: str, uid: int, gid: int) -> None:
    for folder, dirs, files in os.walk(root):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            try:
                os.chown(name, uid, gid, follow_symlinks=False)
            except OSError:
                pass


# --- the scratch working folder -----------------------------------------------------------------

def _filesystem_type(path: str) -> str:
    """The file system type of the mount that holds ``path`` (from ``/proc/self/mounts``)."""
    real, best, fstype = os.path.realpath(path), "", ""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].replace("\\040", " ")
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, fstype = mount, parts[2]
    return fstype


def default_scratch_parent() -> str:
    """Where scratch folders are made: ``$RLHF_SANDBOX_SCRATCH_DIR``, else the first of ``/var/tmp``
    and the temporary folder that is on disk (a tmpfs would count a notebook's data as memory)."""
    configured = os.environ.get("RLHF_SANDBOX_SCRATCH_DIR", "").strip()
    if configured:
        return configured
    for candidate in ("/var/tmp", tempfile.gettempdir()):
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK) \
                and _filesystem_type(candidate) not in ("tmpfs", "ramfs"):
            return candidate
    return tempfile.gettempdir()


def _kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words."""
    for test, name in ((stat.S_ISDIR, "folder"), (stat.S_ISREG, "file"), (stat.S_ISLNK, "symbolic link"),
                       (stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def _copy_regular_file(src: str, dest: str, st: os.stat_result, limit: int) -> int | None:
    """Copy the regular file ``src`` (``st`` its ``lstat``) to the new file ``dest``, at most
    ``limit`` bytes; the number of bytes, or None when ``src`` is not that file any more or is longer."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return None
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      (stat.S_IMODE(st.st_mode) & 0o777) | 0o600)
        copied = 0
        try:
            while True:
                chunk = os.read(fd, min(1 << 20, limit - copied + 1))
                if not chunk:
                    return copied
                copied += len(chunk)
                if copied > limit:
                    break
                os.write(out, chunk)
        finally:
            os.close(out)
        os.unlink(dest)
        return None
    finally:
        os.close(fd)


def copy_regular_tree(src: str, dest: str, limit_bytes: int,
                      max_entries: int = SCRATCH_MAX_ENTRIES) -> list[tuple[str, str]]:
    """Copy the regular files and folders under ``src`` into the existing folder ``dest``, links
    not followed; returns what was NOT copied as ``(path relative to src, why)``: symbolic links,
    FIFOs, sockets, devices, and whatever would exceed ``limit_bytes`` in all or ``max_entries``."""
    skipped: list[tuple[str, str]] = []
    budget = {"bytes": limit_bytes, "entries": max_entries}

    def walk(folder: str, target: str, rel: str) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            skipped.append((rel or ".", f"could not be listed ({exc.strerror})"))
            return
        for entry in entries:
            path = os.path.join(rel, entry.name) if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                skipped.append((path, f"could not be read ({exc.strerror})"))
                continue
            kind = _kind(st.st_mode)
            if kind not in ("folder", "file"):
                skipped.append((path, f"is a {kind}, not a regular file or folder"))
                continue
            budget["entries"] -= 1
            if budget["entries"] < 0:
                skipped.append((path, f"is beyond the first {max_entries} files and folders"))
                continue
            out = os.path.join(target, entry.name)
            if kind == "folder":
                os.mkdir(out, 0o700)
                walk(entry.path, out, path)
                os.chmod(out, (stat.S_IMODE(st.st_mode) & 0o777) | 0o700)
                continue
            copied = None
            if st.st_size <= budget["bytes"]:
                try:
                    copied = _copy_regular_file(entry.path, out, st, budget["bytes"])
                except OSError as exc:
                    skipped.append((path, f"could not be copied ({exc.strerror})"))
                    continue
            if copied is None:
                skipped.append((path, f"is larger ({st.st_size} bytes) than what is left of the "
                                      f"{limit_bytes}-byte limit on a notebook folder's files"))
                continue
            budget["bytes"] -= copied

    walk(src, dest, "")
    return skipped


def remove_tree(path: str) -> bool:
    """Delete the folder ``path`` and everything in it without following links, also folders the
    kernel made unreadable (their owner may add permissions); True when it is gone."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            os.unlink(path)
            return True
    except FileNotFoundError:
        return True
    except OSError:
        return False
    for folder, dirs, _ in os.walk(path):
        for name in dirs:
            sub = os.path.join(folder, name)
            try:
                st = os.lstat(sub)
                if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o700 != 0o700:
                    os.chmod(sub, stat.S_IMODE(st.st_mode) | 0o700)
            except OSError:
                pass
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


class Scratch:
    """A kernel's private working folder: ``<parent>/rlhf-scratch-XXXX/`` (mode 0700, the grader's)
    holding ``work/``, the folder bound at the notebook folder's path in the sandbox, and a lock
    file held (``flock``) while the kernel lives, so that :func:`sweep_stale_scratches` removes
    only the folders of graders that died."""

    def __init__(self, parent: str):
        self.root = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent)
        self._lock = os.open(os.path.join(self.root, SCRATCH_LOCK),
                             os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.work = os.path.join(self.root, "work")
        os.mkdir(self.work, 0o700)

    def remove(self) -> bool:
        """Delete the scratch (links not followed) and free its lock; True when it is gone."""
        gone = remove_tree(self.root)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        return gone


def sweep_stale_scratches(parent: str) -> int:
    """Remove the scratch folders in ``parent`` whose grader died (lock free, older than
    :data:`SCRATCH_SWEEP_AGE`, owned by this user, not a link); returns how many."""
    import time

    removed = 0
    try:
        names = [n for n in os.listdir(parent) if n.startswith(SCRATCH_PREFIX)]
    except OSError:
        return 0
    for name in names:
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() \
                or time.time() - st.st_mtime < SCRATCH_SWEEP_AGE:
            continue
        try:
            fd = os.open(os.path.join(path, SCRATCH_LOCK), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = None
        except OSError:
            continue
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live kernel's scratch
        removed += remove_tree(path)
        if fd is not None:
            os.close(fd)
    return removed


def describe_folder(notebook_dir: str) -> str:
    """``student alice, assignment a1 (autograded/alice/a1)`` for a notebook folder, for log lines."""
    nb = Path(notebook_dir)
    if len(nb.parents) >= 2 and nb.parents[1].name == "autograded":
        return f"student {nb.parent.name}, assignment {nb.name} (autograded/{nb.parent.name}/{nb.name})"
    return f"notebook folder {notebook_dir}"


def processes_of(uid: int) -> list[int]:
    """Pids of the processes whose real user id is ``uid`` (read from ``/proc``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        if int(line.split()[1]) == uid:
                            found.append(int(entry))
                        break
        except (OSError, ValueError, IndexError):
            continue
    return found


def _wait_until_no_process_of(uid: int, timeout: float = 10.0) -> bool:
    """Wait (up to ``timeout`` s) until no process runs as ``uid``; True if none is left."""
    import time

    deadline = time.monotonic() + timeout
    while processes_of(uid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _default_nproc() -> int:
    # threads count too: XLA sizes its thread pools by the number of cores
    return 256 + 16 * (os.cpu_count() or 2)


class SandboxedKernelManager(LimitedKernelManager):
    """:class:`LimitedKernelManager` whose kernels start inside bubblewrap (see the module docstring)."""

    no_sandbox = Bool(
        help=f"Grade WITHOUT the sandbox (rlimits only), with a loud warning; also {NO_SANDBOX_ENV}=1.",
    ).tag(config=True)

    @default("no_sandbox")
    def _no_sandbox_default(self) -> bool:
        return opted_out()

    nproc = Integer(
        _env_int("RLHF_KERNEL_NPROC", _default_nproc()),
        help="Process (and thread) limit of the kernel inside the sandbox (RLIMIT_NPROC); 0 for none.",
    ).tag(config=True)
    tmp_mb = Integer(
        _env_int("RLHF_KERNEL_TMP_MB", 0),
        help="Size of the kernel's private /tmp (tmpfs, memory) in MiB, subtracted from the address-space "
             f"limit (RLIMIT_AS); 0: min({TMP_DEFAULT_MB}, memory_mb / 8). Never more than half of memory_mb.",
    ).tag(config=True)
    scratch_dir = Unicode(
        "", help="Folder (on disk, outside the course) where each kernel's scratch working folder is made; "
                 "empty: $RLHF_SANDBOX_SCRATCH_DIR, else /var/tmp or the temporary folder, whichever is on disk.",
    ).tag(config=True)
    scratch_copy_mb = Integer(
        _env_int("RLHF_SANDBOX_COPY_MB", 512),
        help="Most MiB of a notebook folder's files copied into the kernel's scratch (the rest is skipped "
             "with a log line).",
    ).tag(config=True)
    uid_base = Integer(
        _env_int("RLHF_SANDBOX_UID_BASE", 1_500_000),
        help="First user id given to kernels when the grader runs as root (one id per live kernel).",
    ).tag(config=True)
    course_root = Unicode(
        "", help="Course root: library builds are cached in <root>/.cache/library-builds and the "
                 "source notebooks decide what 'auto' strips. Empty: derived from the notebook folder.",
    ).tag(config=True)
    library_build = CaselessStrEnum(
        ["auto", "strip", "full"], default_value=os.environ.get("RLHF_LIBRARY_BUILD", "auto").lower()
        if os.environ.get("RLHF_LIBRARY_BUILD", "auto").lower() in ("auto", "strip", "full") else "auto",
        help="Which course library the kernel sees. 'strip': the notebook's build without the functions "
             "its students implement. 'full': the library without instructor/. 'auto': 'strip', except "
             "for a notebook whose source still grades inside the kernel (IN_KERNEL_MARKERS: grading.start(), "
             "grading.reference, grading.judge()), which needs the reference functions in the kernel.",
    ).tag(config=True)
    notebook_name = Unicode(
        "", help="The notebook this kernel runs (set by kernel_guard.Execute); selects the library build.",
    )
    judged = Bool(
        False, help="Set by the judge (rlhf_lab.instructor.grader.judge) when it decides this notebook's test cells "
                    "outside the kernel: then nothing grades inside it and 'auto' always strips.",
    )

    _ipc_dir: str | None = None
    _sandbox_cache: str | None = None
    _slot: UidSlot | None = None
    _scratch: Scratch | None = None
    _notebook_dir: str | None = None

    # -- limits ------------------------------------------------------------------------------------
    def tmp_limit_mb(self) -> int:
        """MiB of the private ``/tmp``: :attr:`tmp_mb`, or min(512, memory / 8); at most half the memory."""
        memory = self.memory_mb
        size = self.tmp_mb if self.tmp_mb > 0 else (min(TMP_DEFAULT_MB, memory // 8) if memory > 0
                                                    else TMP_DEFAULT_MB)
        return max(1, min(size, memory // 2)) if memory > 0 else size

    def kernel_memory_mb(self) -> int:
        """RLIMIT_AS of a sandboxed kernel: the memory limit less its private ``/tmp`` (a tmpfs is
        memory that RLIMIT_AS does not count), so address space plus ``/tmp`` stay within ``memory_mb``."""
        if self.no_sandbox or self.memory_mb <= 0:
            return self.memory_mb
        return self.memory_mb - self.tmp_limit_mb()

    # -- life cycle --------------------------------------------------------------------------------
    async def _async_pre_start_kernel(self, **kw):
        if not self.no_sandbox:
            bwrap, problem = availability()
            if bwrap is None:
                raise SandboxUnavailable(refusal_message(problem))
            self._bwrap = bwrap
            # a short private folder for the connection file and the ZeroMQ Unix sockets
            self._ipc_dir = tempfile.mkdtemp(prefix="rlhf-k-")
            os.chmod(self._ipc_dir, 0o700)
            atexit.register(self.release_sandbox)  # also if the grader stops abruptly
            self.transport = "ipc"
            self.connection_file = os.path.join(self._ipc_dir, "kernel.json")
            self.ip = os.path.join(self._ipc_dir, "s")
        else:
            warn_unprotected(self.log)
        return await super()._async_pre_start_kernel(**kw)

    def wrap_launch(self, kernel_cmd: list[str], kw: dict) -> tuple[list[str], dict]:
        """Turn the kernel command into its sandboxed form (called by LimitedKernelManager)."""
        if self.no_sandbox:
            return kernel_cmd, kw
        cwd = os.path.realpath(kw.get("cwd") or os.getcwd())
        self._notebook_dir = cwd
        build = self._library_build(cwd)
        library = _installed_library_dir()
        readonly = [(p, p) for p in python_roots() if os.path.isdir(p)]
        readonly.append((str(build), library))
        writable = [self._ipc_dir]
        if self._cache_dir:
            writable.append(self._cache_dir)
            self._sandbox_cache = self._cache_dir
        if self.seed_cache_dir:  # building a compile-cache seed: the kernel fills this folder
            os.makedirs(self.seed_cache_dir, mode=0o700, exist_ok=True)
            writable.append(os.path.realpath(self.seed_cache_dir))
        scratch = self._make_scratch(cwd)
        uid = -1
        if os.geteuid() == 0:
            self._slot = UidSlot(self.uid_base)
            uid = self._slot.uid
            for path in [scratch.work, *writable]:
                _chown_tree(path, uid, uid)
        kw["cwd"] = cwd
        kw["env"] = sandbox_env(kw.get("env") or os.environ)
        inner = kw.get("preexec_fn")

        def preexec() -> None:  # between fork and exec of bwrap
            if inner is not None:
                inner()
            # SIGINT goes to the whole process group: bwrap must ignore it (the wrapper inside
            # restores it for the kernel) or an interrupt would kill the sandbox
            signal.signal(signal.SIGINT, signal.SIG_IGN)

        kw["preexec_fn"] = preexec
        python = os.path.join(sys.prefix, "bin", "python")
        return bwrap_command(self._bwrap, kernel_cmd, cwd=cwd, scratch=scratch.work, readonly=readonly,
                             writable=writable, uid=uid, nproc=self.nproc, python=python,
                             tmp_bytes=self.tmp_limit_mb() * _kernel_guard.MIB), kw

    def _scratch_parent(self, notebook_dir: str) -> str:
        """The folder for scratch folders; refuses one inside the course (the kernel's files must
        never land where nbgrader or a classmate's grading reads)."""
        parent = os.path.realpath(self.scratch_dir or default_scratch_parent())
        root = os.path.realpath(self._course_root_for(notebook_dir))
        if os.path.commonpath([parent, root]) == root or os.path.commonpath([parent, notebook_dir]) == notebook_dir:
            raise SandboxUnavailable(
                f"the kernel scratch folder {parent} is inside the course {root}: set "
                f"c.SandboxedKernelManager.scratch_dir (or RLHF_SANDBOX_SCRATCH_DIR) to a folder outside it")
        return parent

    def _make_scratch(self, notebook_dir: str) -> Scratch:
        """A fresh scratch holding copies of the notebook folder's regular files and folders."""
        parent = self._scratch_parent(notebook_dir)
        sweep_stale_scratches(parent)
        self._scratch = Scratch(parent)
        skipped = copy_regular_tree(notebook_dir, self._scratch.work, self.scratch_copy_mb * _kernel_guard.MIB)
        for rel, why in skipped:
            self.log.warning("%s: %s %s: not copied into the kernel's working folder, so the notebook "
                             "cannot use it (grading goes on; remove or replace it if the notebook needs it)",
                             describe_folder(notebook_dir), rel, why)
        return self._scratch

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        self.release_sandbox(keep_ipc=restart)

    def release_sandbox(self, keep_ipc: bool = False) -> None:
        """Kill what is left of the sandbox, delete the kernel's scratch folder (links not followed),
        free the kernel's user id and remove its IPC folder. Idempotent; kernel_guard.Execute also
        calls it after every notebook, because nbclient skips the manager's cleanup when a kernel
        died early, and it is registered with ``atexit`` for a grader that is interrupted."""
        self.kill_process_group()
        if self._slot is not None:
            # the kernel's user id is its own: once no process has it, the sandbox is gone and
            # nothing can write into the folders cleaned below any more
            _wait_until_no_process_of(self._slot.uid)
        self.report_kernel_output(wait=0.5)
        if self._cache_copy is not None:  # waits for the copy's writer, then deletes it
            self._cache_copy.remove()
            self._cache_copy = None
        if self._sandbox_cache and os.path.isdir(self._sandbox_cache):
            shutil.rmtree(self._sandbox_cache, ignore_errors=True)
        self._sandbox_cache = None
        if self._scratch is not None:
            if not self._scratch.remove():
                self.log.warning("the kernel scratch folder %s could not be removed entirely; the next "
                                 "kernel start removes it", self._scratch.root)
            self._scratch = None
        if self._slot is not None:
            self._slot.release()
            self._slot = None
        if self._ipc_dir and not keep_ipc:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            self._ipc_dir = None

    # -- the library build -------------------------------------------------------------------------
    def _course_root_for(self, notebook_dir: str) -> Path:
        if self.course_root:
            return Path(self.course_root)
        nb = Path(notebook_dir)
        if len(nb.parents) >= 3 and nb.parents[1].name == "autograded":
            return nb.parents[2]
        return Path(tempfile.gettempdir()) / "rlhf-library-builds"

    def _library_build(self, notebook_dir: str) -> Path:
        lb = _sibling("library_build.py", "rlhf_lab_course_library_build")
        root = self._course_root_for(notebook_dir)
        root.mkdir(parents=True, exist_ok=True)
        assignment = Path(notebook_dir).name
        notebook = self.notebook_name or None
        mode = self.library_build
        if mode == "auto":
            mode = "strip" if self.judged or not _grades_in_kernel(root, assignment, notebook) else "full"
        build = lb.ensure_build(root, assignment, notebook, strip=(mode == "strip"))
        self.log.debug("library build %s for %s/%s (%s)", build.key, assignment, notebook or "*", mode)
        return build.path


def _installed_library_dir() -> str:
    spec = importlib.util.find_spec("rlhf_lab")
    if spec is None or not spec.submodule_search_locations:
        raise SandboxUnavailable("the course library rlhf_lab is not installed in this environment")
    return os.path.realpath(list(spec.submodule_search_locations)[0])


def _grades_in_kernel(root: Path, assignment: str, notebook: str | None) -> bool:
    """Does the source of this notebook (any of the assignment's, if unknown) still decide grades
    inside the kernel with the library's reference functions?"""
    folder = root / "source" / assignment
    paths = [folder / f"{Path(notebook).stem}.ipynb"] if notebook else sorted(folder.glob("*.ipynb"))
    for path in paths:
        try:
            cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        except (OSError, ValueError):
            continue
        text = "\n".join("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "code")
        if any(marker in text for marker in IN_KERNEL_MARKERS):
            return True
    return False


def main(argv=None) -> int:
    """``python -m rlhf_lab.instructor.grader.sandbox``: say whether grading kernels can be sandboxed here."""
    import argparse

    argparse.ArgumentParser(description="Check that the grading sandbox (bubblewrap) works on this machine.") \
        .parse_args(argv)
    if opted_out():
        warn_unprotected()
        return 0
    bwrap, problem = availability()
    if bwrap is None:
        print(refusal_message(problem), file=sys.stderr)
        return 1
    print(f"sandbox ready: {bwrap} works (kernels run as {'their own user ids' if os.geteuid() == 0 else 'you'} "
          f"in their own PID and network namespaces)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
