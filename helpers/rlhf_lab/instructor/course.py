"""The course being graded: one object built once from a root, passed to everything above it.

:class:`Course` holds what the grading code needs to know about an nbgrader course: its root,
its course id, its gradebook URL and nbgrader's folder layout (read from ``nbgrader_config.py``
by :meth:`Course.load`), and answers the questions every step asks: which assignments are graded,
which students submitted, the environment and command line of an nbgrader subprocess.

This is the lowest layer of the instructor package: it imports nothing else of it but :mod:`.confine`
(standard library only). The pipeline,
the executors, the run records, the pre-flight, backup, guides and the feedback command build a
:class:`Course` once (or take one) instead of resolving ``root=None`` again in every function.

The free functions (:func:`course_root`, :func:`nbgrader_env`, :func:`run_nbgrader`, ...) are the
same operations for callers that only have a root; :mod:`.pipeline` re-exports them.
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Sequence

from . import confine

COURSE_ID = "rlhf-ppo"
REPO_ROOT = Path(__file__).resolve().parents[3]
#: seconds for one student's whole nbgrader run
DEFAULT_STUDENT_TIMEOUT = float(os.environ.get("RLHF_STUDENT_TIMEOUT", "900"))


class PipelineError(RuntimeError):
    """A pipeline step that must succeed for everyone (generate, config check) failed."""


# --------------------------------------------------------------------------------------- paths/env
def course_root(root: str | os.PathLike | None = None) -> Path:
    """The course root: ``root`` if given, else ``$RLHF_COURSE_ROOT``, else the repository root."""
    if root is not None:
        return Path(root).resolve()
    env = os.environ.get("RLHF_COURSE_ROOT")
    return Path(env).resolve() if env else REPO_ROOT


def venv_bin() -> str:
    """The ``bin`` folder of the running interpreter (where ``nbgrader``, ``alembic`` and ``jupyter`` live)."""
    return str(Path(sys.executable).parent)


def ensure_venv_on_path() -> None:
    """Put :func:`venv_bin` first on this process's PATH (the in-process Gradebook may call ``alembic``)."""
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != venv_bin():
        os.environ["PATH"] = venv_bin() + os.pathsep + path


def default_db_url(root: str | os.PathLike | None = None) -> str:
    """``$RLHF_COURSE_DB`` if set, else SQLite ``<root>/gradebook.db`` (what ``nbgrader_config.py`` uses).

    The environment variable wins even for an explicit ``root``, exactly as in the config; code
    working on a copy of the course should pass ``db_url`` explicitly.
    """
    return os.environ.get("RLHF_COURSE_DB") or "sqlite:///" + str(course_root(root) / "gradebook.db")


def nbgrader_env(root: str | os.PathLike | None = None, db_url: str | None = None,
                 extra: dict | None = None) -> dict:
    """Environment for an nbgrader subprocess working on ``root`` with gradebook ``db_url``.

    The venv's bin comes first on PATH; JAX is pinned to the CPU; ``MPLBACKEND`` is removed so the
    kernel keeps its inline backend (a test runner's ``Agg`` makes every ``plt.show()`` warn), and
    ``PYTEST_CURRENT_TEST`` is removed so kernels capture native stderr as they do in production.
    ``TF_CPP_MIN_LOG_LEVEL=2`` keeps XLA's C++ warnings out of cell outputs and feedback.
    """
    env = dict(os.environ)
    env["PATH"] = venv_bin() + os.pathsep + env.get("PATH", "")
    env["RLHF_COURSE_ROOT"] = str(course_root(root))
    env["RLHF_COURSE_DB"] = db_url or default_db_url(root)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("MPLBACKEND", None)
    env.pop("NBGRADER_EXECUTION", None)
    # Under pytest, ipykernel sees PYTEST_CURRENT_TEST and stops forwarding native (file descriptor)
    # stdout/stderr into cell outputs: grade under tests exactly as in production.
    env.pop("PYTEST_CURRENT_TEST", None)
    if extra:
        env.update(extra)
    return env


# ------------------------------------------------------------------------------- grading account
@dataclasses.dataclass(frozen=True)
class Account:
    """The Linux account an nbgrader subprocess runs as: ids, supplementary groups, home."""

    name: str
    uid: int
    gid: int
    groups: tuple
    home: str

    def popen_kwargs(self) -> dict:
        """``subprocess.Popen`` arguments that start the process as this account."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def env(self, env: dict) -> dict:
        """``env`` for a process of this account: its ``HOME``, ``USER`` and ``LOGNAME``; no
        ``XDG_RUNTIME_DIR`` (root's, where Jupyter would put its runtime files)."""
        env = dict(env, HOME=self.home, USER=self.name, LOGNAME=self.name)
        env.pop("XDG_RUNTIME_DIR", None)
        return env


def grading_account(euid: int, owner_uid: int, passwd=None, grouplist=None) -> Account | None:
    """The account nbgrader runs as when this process has effective uid ``euid`` and the course root
    belongs to ``owner_uid``: that owner's (uid, primary gid, the supplementary groups
    ``os.initgroups`` would give it, home) when ``euid`` is 0 and the owner is not root; ``None``
    (this process's own account) otherwise. ``passwd(uid)`` and ``grouplist(name, gid)`` default
    to ``pwd.getpwuid`` and ``os.getgrouplist``; an owner with no passwd entry keeps ``None``."""
    if euid != 0 or owner_uid == 0:
        return None
    import pwd

    try:
        entry = (passwd or pwd.getpwuid)(owner_uid)
    except KeyError:
        return None
    groups = tuple((grouplist or os.getgrouplist)(entry.pw_name, entry.pw_gid))
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/")


def account_outputs(root, db_url: str | None = None, folders: Sequence[str] = ("autograded", "feedback", "submitted")) -> list[str]:
    """What nbgrader's account must own in the course at ``root``: the SQLite gradebook file and
    the top ``folders`` (those that exist are checked, see :func:`foreign_outputs`)."""
    root = os.path.abspath(os.fspath(root))
    paths = [os.path.join(root, f) for f in folders]
    db = sqlite_path(db_url or default_db_url(root))
    return ([db] if db else []) + paths


def foreign_outputs(paths: Sequence[str], uid: int, lstat=os.lstat) -> list[tuple[str, int]]:
    """``(path, owner uid)`` of each of ``paths`` that exists (``lstat``: a link is its own) and is
    owned by an account other than ``uid``."""
    out = []
    for path in paths:
        try:
            st = lstat(path)
        except FileNotFoundError:
            continue
        if st.st_uid != uid:
            out.append((path, st.st_uid))
    return out


def ownership_refusal(account: Account, foreign: Sequence[tuple[str, int]]) -> str | None:
    """One line refusing to grade as ``account`` while ``foreign`` paths (from :func:`foreign_outputs`)
    belong to another account, with the command that fixes it; ``None`` when there are none.
    Nothing is changed here: a course path may be a student's link, never ``chown``-ed as root."""
    if not foreign:
        return None
    path, owner = foreign[0]
    who = "root (left by an earlier run as root)" if owner == 0 else f"uid {owner}"
    more = f" (and {len(foreign) - 1} more: " + ", ".join(p for p, _ in foreign[1:]) + ")" if len(foreign) > 1 else ""
    return (f"not grading: {path} is owned by {who}, but nbgrader runs as {account.name}, the course root's "
            f"owner, and must write it{more}; fix it with: chown -R {account.name} "
            + " ".join(p for p, _ in foreign))


def reach_check(command: Sequence[str]) -> list[str]:
    """A cheap command line that succeeds only when its account can run ``command``'s Python and
    read its script (``command`` is :func:`nbgrader_command`) and find the course library."""
    python, *rest = command
    script = next((a for a in rest if a.endswith(".py")), None)
    code = ("import importlib.util, sys\n"
            f"open({script!r}, 'rb').close()\n" if script else "import importlib.util, sys\n") + \
        "sys.exit(importlib.util.find_spec('rlhf_lab') is None and 'no rlhf_lab')\n"
    return [python, "-c", code]


def unreachable_refusal(account: Account, python: str, detail: str) -> str:
    """One line refusing to grade as ``account`` because it cannot run the course's Python."""
    return (f"not grading: the course root's owner {account.name}, as whom nbgrader runs, cannot run this "
            f"course's Python {python} ({detail or 'failed'}); make the venv, its base interpreter "
            f"({os.path.realpath(python)}) and the repository readable by {account.name}, or run the course "
            f"command as {account.name}")


_REACHES: dict = {}


def account_reach(account: Account, root, db_url: str | None = None) -> str | None:
    """:func:`unreachable_refusal` when ``account`` cannot run :func:`reach_check` (checked once per
    account and process), else ``None``."""
    command = nbgrader_command()
    key = (account, tuple(command))
    if key not in _REACHES:
        try:
            done = subprocess.run(reach_check(command), cwd=root, env=account.env(nbgrader_env(root, db_url)),
                                  capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                                  **account.popen_kwargs())
            detail = "" if done.returncode == 0 else (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            ok = done.returncode == 0
        except (OSError, subprocess.SubprocessError) as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        _REACHES[key] = None if ok else unreachable_refusal(account, command[0], detail[:300])
    return _REACHES[key]


ROOT_NOTICE = ("note: the course root {root} is owned by root: grading and feedback run confined (uid 0 without "
               "the machine's capabilities, writing only the students' folders the step writes, integrity/, "
               ".cache/ and the gradebook); to grade as an unprivileged account, give the course root to an instructor account "
               "(chown -R <instructor> {root})")
#: The course roots whose :data:`ROOT_NOTICE` this process or one that started it already printed
#: (kept in the environment, so a pool's workers say nothing).
NOTICE_ENV = "RLHF_ROOT_NOTICE_SHOWN"


def account_for_course(root, db_url: str | None = None) -> tuple[Account | None, str | None]:
    """``(account, refusal)`` for an nbgrader run on the course at ``root`` from this process:
    :func:`grading_account` of the root's owner, and :func:`ownership_refusal` of what that account
    must write, or :func:`account_reach` when it cannot run the course's Python. As root with a
    root-owned course, :data:`ROOT_NOTICE` is printed once per process and course root, and not
    again in the processes it starts after that (:data:`NOTICE_ENV`)."""
    root = os.path.abspath(os.fspath(root))
    euid = os.geteuid()
    owner = os.stat(root).st_uid
    account = grading_account(euid, owner)
    if account is None:
        shown = os.environ.get(NOTICE_ENV, "").split(os.pathsep)
        if euid == 0 and owner == 0 and root not in shown:
            # this process and those it starts from now on (a pool's workers) know that it was said
            os.environ[NOTICE_ENV] = os.pathsep.join([*filter(None, shown), root])
            print(ROOT_NOTICE.format(root=root), file=sys.stderr, flush=True)
        return None, None
    refusal = ownership_refusal(account, foreign_outputs(account_outputs(root, db_url), account.uid))
    return account, refusal or account_reach(account, root, db_url)


# ------------------------------------------------------------------------------------ nbgrader runs
@dataclasses.dataclass
class CommandRun:
    """One nbgrader subprocess: its arguments, exit code, wall time and combined stdout+stderr."""

    args: list
    returncode: int
    seconds: float
    output: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def errors(self) -> list[str]:
        """nbgrader's ERROR log lines (without the log prefix)."""
        return log_lines(self.output, "ERROR")

    def warnings(self) -> list[str]:
        return log_lines(self.output, "WARNING")


#: The app name of the log line a refused run carries (read by :func:`log_lines` like nbgrader's).
COMMAND_APP = "RlhfCourse"
_LOG_LINE = re.compile(r"^\[(?P<app>\w+) \| (?P<level>[A-Z]+)\]\s?(?P<msg>.*)$")


def log_lines(output: str, level: str) -> list[str]:
    """The messages of nbgrader's ``[App | LEVEL]`` log lines of ``level`` in ``output``."""
    out = []
    for line in output.splitlines():
        m = _LOG_LINE.match(line.strip())
        if m and m.group("level") == level and m.group("msg").strip():
            out.append(m.group("msg").strip())
    return out


def nbgrader_command() -> list[str]:
    """The nbgrader command line: ``python <this folder>/nbgrader_cli.py`` (nbgrader's own ``main``
    without 4-7 s of start-up imports, see :mod:`.nbgrader_cli`), or ``python -m nbgrader`` when
    ``RLHF_PLAIN_NBGRADER=1``."""
    if os.environ.get("RLHF_PLAIN_NBGRADER") == "1":
        return [sys.executable, "-m", "nbgrader"]
    return [sys.executable, str(Path(__file__).with_name("classrun") / "nbgrader_cli.py")]


def confine_if_root(cmd: Sequence[str], root, db_url: str | None = None) -> tuple[list[str], str | None]:
    """``(command, refusal)``: ``cmd`` (an nbgrader command line, possibly after a ``setpriv`` prefix)
    run confined (:mod:`.confine`) when this process is root, the course root is root's and the
    subcommand grades or writes feedback; unchanged otherwise. The refusal is one line when the
    confinement cannot be built (no bubblewrap)."""
    cmd, base = [str(c) for c in cmd], nbgrader_command()
    start = next((i for i in range(len(cmd)) if cmd[i:i + len(base)] == base), None)
    sub = cmd[start + len(base)] if start is not None and len(cmd) > start + len(base) else ""
    if not confine.needed(root, sub):
        return cmd, None
    try:
        return cmd[:start] + confine.confined_command(cmd[start:], root, student=confine.student_of(cmd),
                                                      db_url=db_url), None
    except (OSError, RuntimeError) as exc:
        return cmd, f"not grading: {exc}"


def run_nbgrader(args: Sequence[str], root=None, db_url: str | None = None,
                 timeout: float | None = None, extra_env: dict | None = None,
                 started=None) -> CommandRun:
    """Run nbgrader (:func:`nbgrader_command`) with ``args`` in the course root; never raises on failure.

    Run as root on a course root owned by another account, nbgrader runs as that account
    (:func:`account_for_course`); when something it must write is not its own, nothing runs and
    the failed run's output is the one line that says how to fix it.

    The command gets its own process group; on ``timeout`` the whole group (nbgrader and the
    kernels it started) is killed and the run is marked ``timed_out``. ``started(pid)``, when
    given, is called once the process exists.
    """
    root = course_root(root)
    cmd = [*nbgrader_command(), *map(str, args)]
    start = time.perf_counter()
    account, refusal = account_for_course(root, db_url)
    if account is None and not refusal:
        cmd, refusal = confine_if_root(cmd, root, db_url)
    if refusal:
        return CommandRun([*nbgrader_command()[1:], *map(str, args)], 1, 0.0, f"[{COMMAND_APP} | ERROR] {refusal}\n")
    env, kwargs = nbgrader_env(root, db_url, extra_env), {}
    if account is not None:
        env, kwargs = account.env(env), account.popen_kwargs()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True, **kwargs)
    if started is not None:
        try:
            started(proc.pid)
        except BaseException:
            kill_group(proc)
            proc.communicate()
            raise
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
        output, _ = proc.communicate()
    except BaseException:  # KeyboardInterrupt: never leave nbgrader or its kernels behind
        kill_group(proc)
        proc.communicate()
        raise
    return CommandRun([*nbgrader_command()[1:], *map(str, args)], proc.returncode, time.perf_counter() - start,
                      output, timed_out)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def check_config(root=None, db_url: str | None = None) -> dict:
    """Load ``<root>/nbgrader_config.py`` the way nbgrader does and check the settings that matter.

    nbgrader only logs a warning when its config file fails to load and would then grade with its
    defaults (wrong root, stderr scoring zero). Raises :class:`PipelineError` on any problem;
    returns the key settings.
    """
    from traitlets.config.loader import PyFileConfigLoader

    root = course_root(root)
    path = root / "nbgrader_config.py"
    if not path.exists():
        raise PipelineError(f"{path} is missing")
    saved = dict(os.environ)
    try:
        os.environ.update({"RLHF_COURSE_ROOT": str(root), "RLHF_COURSE_DB": db_url or default_db_url(root)})
        cfg = PyFileConfigLoader(path.name, path=str(root)).load_config()
    except Exception as exc:  # noqa: BLE001 - report any config error as a pipeline error
        raise PipelineError(f"{path} failed to load: {exc!r}") from exc
    finally:
        os.environ.clear()
        os.environ.update(saved)
    names = [getattr(p, "__name__", str(p)) for p in cfg.Autograde.get("autograde_preprocessors", [])]
    settings = {
        "course_id": cfg.CourseDirectory.get("course_id"),
        "root": cfg.CourseDirectory.get("root"),
        "db_url": cfg.CourseDirectory.get("db_url"),
        "timeout": cfg.Execute.get("timeout"),
        "autograde_preprocessors": names,
    }
    problems = []
    if settings["course_id"] != COURSE_ID:
        problems.append(f"course_id is {settings['course_id']!r}, expected {COURSE_ID!r}")
    if Path(settings["root"] or "").resolve() != root:
        problems.append(f"root is {settings['root']!r}, expected {str(root)!r}")
    if "StderrToStdout" not in names or names.index("StderrToStdout") < names.index("Execute"):
        problems.append("StderrToStdout must follow Execute in Autograde.autograde_preprocessors")
    if not settings["timeout"]:
        problems.append("Execute.timeout (per-cell timeout) is not set")
    if problems:
        raise PipelineError(f"{path}: " + "; ".join(problems))
    return settings


# ------------------------------------------------------------------------------------- assignments
def assignments(root=None) -> list[str]:
    """Assignment names: folders of ``source/`` that hold at least one notebook, sorted."""
    src = course_root(root) / "source"
    if not src.is_dir():
        return []
    return sorted(p.name for p in src.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and any(p.glob("*.ipynb")))


def is_grade_cell(cell) -> bool:
    md = cell.get("metadata", {}).get("nbgrader", {})
    return bool(md.get("grade")) or bool(md.get("task"))


def graded_assignments(root=None) -> list[str]:
    """Assignments with at least one graded cell (the explorer has none and is never submitted)."""
    import nbformat

    out = []
    for name in assignments(root):
        for path in sorted((course_root(root) / "source" / name).glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            if any(is_grade_cell(c) for c in nb.cells):
                out.append(name)
                break
    return out


def notebooks(assignment: str, root=None, where: str = "source") -> list[str]:
    """Notebook names (without ``.ipynb``) of ``assignment`` in ``where`` (source or release)."""
    return sorted(p.stem for p in (course_root(root) / where / assignment).glob("*.ipynb"))


def submitted_students(assignment: str, root=None) -> list[str]:
    """Students with a ``submitted/<student>/<assignment>/`` folder, sorted."""
    sub = course_root(root) / "submitted"
    if not sub.is_dir():
        return []
    return sorted(p.name for p in sub.iterdir() if (p / assignment).is_dir())


# ------------------------------------------------------------------------------------ gradebook URL
def is_sqlite(db_url: str) -> bool:
    return db_url.startswith("sqlite:")


def sqlite_path(db_url: str) -> str | None:
    """The file of a ``sqlite:///`` URL (query string dropped), or None for other databases."""
    if not is_sqlite(db_url):
        return None
    path = db_url.split("///", 1)[1] if "///" in db_url else ""
    return urllib.parse.urlsplit("file:" + path).path or None


def normalise_db_url(db_url: str) -> str:
    """``postgresql://`` -> ``postgresql+psycopg2://`` when psycopg 3 is absent.

    SQLAlchemy 2.1 maps a bare ``postgresql://`` to the psycopg 3 driver; the course pins
    ``psycopg2-binary``, so the plain URL an instructor types is pointed at that driver.
    """
    for prefix in ("postgresql://", "postgres://"):
        if db_url.startswith(prefix):
            try:
                import psycopg  # noqa: F401
            except ImportError:
                return "postgresql+psycopg2://" + db_url[len(prefix):]
            return "postgresql://" + db_url[len(prefix):]
    return db_url


def db_identity(db_url: str) -> str:
    """A password-free, option-free name of a gradebook, used to tie run records to it."""
    from sqlalchemy.engine import make_url

    url = make_url(normalise_db_url(db_url))
    url = url.set(query={})
    return url.render_as_string(hide_password=True)


# ------------------------------------------------------------------------------------- the object
class CourseError(RuntimeError):
    """The course folder or its config cannot be used (clear message, nothing graded)."""


@dataclasses.dataclass(frozen=True)
class Course:
    """One nbgrader course, as its config describes it (plain strings: picklable for Dask workers).

    Build it once with :meth:`load`; every step above this module takes it instead of a root.
    """

    root: str
    course_id: str
    db_url: str
    submitted_directory: str
    autograded_directory: str
    source_directory: str
    directory_structure: str

    # -- construction
    @classmethod
    def load(cls, root: str | os.PathLike | None = None, db_url: str | None = None) -> "Course":
        """Read ``nbgrader_config.py`` of the course at ``root`` (default: ``$RLHF_COURSE_ROOT`` or the repo).

        The config is evaluated the way nbgrader does it (``get_config()`` in scope) with
        ``RLHF_COURSE_ROOT`` pointing at ``root`` and, when given, ``RLHF_COURSE_DB`` at ``db_url``.
        """
        from nbgrader.coursedir import CourseDirectory
        from traitlets.config.loader import PyFileConfigLoader

        root = os.path.abspath(os.fspath(root or os.environ.get("RLHF_COURSE_ROOT") or REPO_ROOT))
        cfg_file = os.path.join(root, "nbgrader_config.py")
        if not os.path.isdir(root):
            raise CourseError(f"course root {root!r} is not a folder")
        saved = {k: os.environ.get(k) for k in ("RLHF_COURSE_ROOT", "RLHF_COURSE_DB")}
        os.environ["RLHF_COURSE_ROOT"] = root
        if db_url:
            os.environ["RLHF_COURSE_DB"] = db_url
        try:
            config = PyFileConfigLoader("nbgrader_config.py", path=root).load_config() \
                if os.path.exists(cfg_file) else None
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        coursedir = CourseDirectory(config=config) if config is not None else CourseDirectory()
        coursedir.root = root  # the folder we were asked to grade, whatever the config says
        url = normalise_db_url(db_url or coursedir.db_url)
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            # nbgrader resolves a relative SQLite path against its working directory (the root)
            url = "sqlite:///" + os.path.join(root, url[len("sqlite:///"):])
        return cls(root=root, course_id=coursedir.course_id, db_url=url,
                   submitted_directory=coursedir.submitted_directory,
                   autograded_directory=coursedir.autograded_directory,
                   source_directory=coursedir.source_directory,
                   directory_structure=coursedir.directory_structure)

    # -- paths
    @property
    def path_root(self) -> Path:
        return Path(self.root).resolve()

    def path(self, step: str, student: str, assignment: str) -> str:
        """``root/<step>/<student>/<assignment>`` following nbgrader's ``directory_structure``."""
        return os.path.join(self.root, self.directory_structure.format(
            nbgrader_step=step, student_id=student, assignment_id=assignment))

    def submitted(self, student: str, assignment: str) -> Path:
        return Path(self.path(self.submitted_directory, student, assignment))

    def autograded(self, student: str, assignment: str) -> Path:
        return Path(self.path(self.autograded_directory, student, assignment))

    # -- what there is to grade
    def assignments(self) -> list[str]:
        return assignments(self.root)

    def graded_assignments(self) -> list[str]:
        return graded_assignments(self.root)

    def notebooks(self, assignment: str, where: str = "source") -> list[str]:
        return notebooks(assignment, self.root, where)

    def submitted_students(self, assignment: str) -> list[str]:
        return submitted_students(assignment, self.root)

    # -- nbgrader
    def env(self, db_url: str | None = None, extra: dict | None = None) -> dict:
        """:func:`nbgrader_env` for this course (gradebook ``db_url`` or the course's)."""
        return nbgrader_env(self.root, db_url or self.db_url, extra)

    def run_nbgrader(self, args: Sequence[str], timeout: float | None = None, extra_env: dict | None = None,
                     started=None, db_url: str | None = None) -> CommandRun:
        return run_nbgrader(args, self.root, db_url or self.db_url, timeout=timeout, extra_env=extra_env,
                            started=started)

    def check_config(self) -> dict:
        return check_config(self.root, self.db_url)


def as_course(course_or_root=None, db_url: str | None = None) -> Course:
    """``course_or_root`` when it is a :class:`Course` already, else :meth:`Course.load` of that root."""
    if isinstance(course_or_root, Course):
        return course_or_root
    root = course_root(course_or_root)
    return Course.load(root, db_url or default_db_url(root))
