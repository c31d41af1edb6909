"""Grade a whole class in parallel: one real ``nbgrader autograde`` per student, fanned out on Dask.

Usage (from the course root, with the virtual environment's ``bin`` first on PATH)::

    python -m rlhf_lab.instructor.parallel ASSIGNMENT                    # LocalCluster sized to the machine
    python -m rlhf_lab.instructor.parallel ASSIGNMENT --workers 4
    python -m rlhf_lab.instructor.parallel ASSIGNMENT --scheduler tcp://host:8786   # existing cluster
    python -m rlhf_lab.instructor.parallel ASSIGNMENT --db postgresql://user@host/gradebook
    python -m rlhf_lab.instructor.parallel ASSIGNMENT --sequential       # the plain loop, no Dask
    python -m rlhf_lab.instructor.parallel ASSIGNMENT --force            # regrade everyone

Design
------
*One task per student.*  Each task runs ``nbgrader autograde ASSIGNMENT --student ID --force`` as a
subprocess in the course root (``--force`` so a half-finished earlier attempt is wiped and the
student is regraded from scratch: the task is idempotent).  The child gets ``PDEATHSIG=KILL``
(``setpriv``) so a worker that dies takes its nbgrader with it (the kernel follows through
ipykernel's parent poller), and the task's own record of a previous attempt lets a retry kill any
survivor on the same host before it starts.  Dask retries a task once when nbgrader hit a
transient gradebook error (``retries=1``), and the LocalCluster's scheduler allows one worker
death per task (``allowed-failures=1``): a student whose worker was killed is regraded once on
another worker, a second death marks that student failed.

*Gradebook safety.*  Before the fan-out the gradebook is initialised exactly once in this process
(schema + alembic version, the course row and nbgrader's implicit ``default_course`` row, the
assignment recorded from ``source/`` when missing, every student row created), so concurrent
first use never races on ``CREATE TABLE`` or a duplicate insert (PostgreSQL or SQLite).  nbgrader never keeps a database transaction open while a notebook executes: it
writes in short bursts (student and submission rows before execution, one commit per graded cell
after it), each transaction starting with its write.  For SQLite the worker URL therefore carries
a busy timeout (``?timeout=…``): a writer that finds the file locked waits for the other
writer's few-millisecond commit instead of failing, which serialises the writes through SQLite's
own file lock while the notebooks (the expensive part) run in parallel.  Anything that still
reports "database is locked" is retried (the task is idempotent), and the run ends with
``PRAGMA integrity_check``.  SQLite's locking is only safe on one machine, so parallel grading
into SQLite is refused when a worker runs on another host (use ``--db postgresql://…``).

*Existing clusters* (``--scheduler``): every worker needs this environment (nbgrader, the
course package) and the course folder at the same path (shared storage); the gradebook then
has to be PostgreSQL unless all workers run on this machine.  Retry limits are the cluster's own
(Dask's default ``allowed-failures`` is 3).

*Resume.*  Each task keeps a small JSON record per student in ``.autograde_runs/ASSIGNMENT/``
(state running/done/failed, attempt, host, pids, time, reason, a fingerprint of the submitted
files, the gradebook it wrote to) next to nbgrader's log of the run.  A student counts as
completed when the record says done for this gradebook and this submission, the autograded
notebooks exist and the gradebook has the submission; re-running grades only the others unless
``--force``.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Callable, Sequence, TextIO

RUNS_DIRNAME = ".autograde_runs"
# seconds for one student's whole nbgrader run (same setting as the sequential pipeline)
DEFAULT_STUDENT_TIMEOUT = float(os.environ.get("RLHF_STUDENT_TIMEOUT", "900"))
SQLITE_BUSY_TIMEOUT = 300.0  # seconds a SQLite writer waits for the lock before giving up
REPO_ROOT = Path(__file__).resolve().parents[3]

_TRANSIENT_PATTERNS = (
    "database is locked",
    "database table is locked",
    "could not serialize access",
    "deadlock detected",
    "server closed the connection unexpectedly",
)


class ParallelGradingError(RuntimeError):
    """A configuration problem that stops the whole run (clear message, nothing graded)."""


class TransientGradebookError(RuntimeError):
    """nbgrader failed on a gradebook lock/connection problem: worth one retry (the task is idempotent)."""


# ----------------------------------------------------------------------------------------------
# Course discovery
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Course:
    """What the orchestrator needs to know about an nbgrader course (read from its config)."""

    root: str
    course_id: str
    db_url: str
    submitted_directory: str
    autograded_directory: str
    source_directory: str
    directory_structure: str

    def path(self, step: str, student: str, assignment: str) -> str:
        """``root/<step>/<student>/<assignment>`` following nbgrader's ``directory_structure``."""
        return os.path.join(self.root, self.directory_structure.format(
            nbgrader_step=step, student_id=student, assignment_id=assignment))


def venv_bin() -> str:
    """The folder of the running interpreter's scripts (``nbgrader``, ``alembic``, ``jupyter``)."""
    return os.path.dirname(os.path.abspath(sys.executable))


def grading_env(course: Course, db_url: str | None = None) -> dict[str, str]:
    """Environment for nbgrader subprocesses: exactly the sequential pipeline's (venv ``bin`` first
    on PATH, ``RLHF_COURSE_ROOT``/``RLHF_COURSE_DB``, JAX on the CPU, no ``MPLBACKEND``)."""
    from .pipeline import nbgrader_env

    return nbgrader_env(course.root, db_url or course.db_url)


def load_course(root: str | os.PathLike | None = None, db_url: str | None = None) -> Course:
    """Read ``nbgrader_config.py`` of the course at ``root`` (default: ``$RLHF_COURSE_ROOT`` or the repo).

    The config is evaluated the way nbgrader does it (``get_config()`` in scope) with
    ``RLHF_COURSE_ROOT`` pointing at ``root`` and, when given, ``RLHF_COURSE_DB`` at ``db_url``.
    """
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    root = os.path.abspath(os.fspath(root or os.environ.get("RLHF_COURSE_ROOT") or REPO_ROOT))
    cfg_file = os.path.join(root, "nbgrader_config.py")
    if not os.path.isdir(root):
        raise ParallelGradingError(f"course root {root!r} is not a folder")
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
    return Course(root=root, course_id=coursedir.course_id, db_url=url,
                  submitted_directory=coursedir.submitted_directory,
                  autograded_directory=coursedir.autograded_directory,
                  source_directory=coursedir.source_directory,
                  directory_structure=coursedir.directory_structure)


def find_students(course: Course, assignment: str) -> list[str]:
    """Student ids that have ``submitted/<id>/<assignment>/`` (sorted)."""
    template = course.path(course.submitted_directory, "\0", assignment)
    head, tail = template.split("\0", 1)
    regexp = re.compile(re.escape(head) + "(.+)" + re.escape(tail))
    students = []
    for path in glob.glob(glob.escape(head) + "*" + glob.escape(tail)):
        m = regexp.fullmatch(path)
        if m and os.path.isdir(path):
            students.append(m.group(1))
    return sorted(students)


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


def worker_db_url(db_url: str, busy_timeout: float = SQLITE_BUSY_TIMEOUT) -> str:
    """The URL workers pass to nbgrader: SQLite gets a busy timeout (seconds) unless one is set."""
    if not is_sqlite(db_url):
        return db_url
    parts = urllib.parse.urlsplit(db_url)
    query = urllib.parse.parse_qs(parts.query)
    if "timeout" in query:
        return db_url
    sep = "&" if parts.query else "?"
    return f"{db_url}{sep}timeout={busy_timeout:g}"


def db_identity(db_url: str) -> str:
    """A password-free, option-free name of a gradebook, used to tie run records to it."""
    from sqlalchemy.engine import make_url

    url = make_url(normalise_db_url(db_url))
    url = url.set(query={})
    return url.render_as_string(hide_password=True)


def submission_fingerprint(course: Course, assignment: str, student: str) -> str:
    """sha256 over the submitted files (relative names and bytes): changes when a student resubmits."""
    base = course.path(course.submitted_directory, student, assignment)
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            digest.update(os.path.relpath(full, base).encode("utf-8", "surrogateescape") + b"\0")
            try:
                with open(full, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        digest.update(block)
            except OSError as exc:  # unreadable file: still a stable fingerprint
                digest.update(repr(exc).encode())
            digest.update(b"\0")
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------
# Run records (resume + idempotent retry)
# ----------------------------------------------------------------------------------------------

def runs_dir(course: Course, assignment: str) -> str:
    return os.path.join(course.root, RUNS_DIRNAME, assignment)


def _record_stem(student: str) -> str:
    return urllib.parse.quote(student, safe="")


def record_path(course: Course, assignment: str, student: str) -> str:
    return os.path.join(runs_dir(course, assignment), _record_stem(student) + ".json")


def log_path(course: Course, assignment: str, student: str) -> str:
    return os.path.join(runs_dir(course, assignment), _record_stem(student) + ".log")


def read_record(course: Course, assignment: str, student: str) -> dict | None:
    try:
        with open(record_path(course, assignment, student), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def write_record(course: Course, assignment: str, student: str, record: dict) -> None:
    """Atomically replace the student's run record (write a temp file, then rename)."""
    path = record_path(course, assignment, student)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1, ensure_ascii=False)
    os.replace(tmp, path)


def autograded_notebooks(course: Course, assignment: str, student: str) -> list[str]:
    return sorted(glob.glob(os.path.join(
        glob.escape(course.path(course.autograded_directory, student, assignment)), "*.ipynb")))


def is_completed(course: Course, assignment: str, student: str, db_url: str,
                 submitted_in_db: set[str] | None = None) -> bool:
    """True when this student's last autograde of this submission into this gradebook finished."""
    rec = read_record(course, assignment, student)
    if not rec or rec.get("state") != "done":
        return False
    if rec.get("db") != db_identity(db_url):
        return False
    if rec.get("fingerprint") != submission_fingerprint(course, assignment, student):
        return False
    if not autograded_notebooks(course, assignment, student):
        return False
    if submitted_in_db is not None and student not in submitted_in_db:
        return False
    return True


def begin_record(course: Course, assignment: str, student: str, db_url: str) -> dict:
    """Start one autograde attempt: end an orphaned earlier attempt, write a ``running`` record.

    The attempt number grows while the previous record still says ``running`` (that attempt never
    finished: its process was killed). The record ties the attempt to this gradebook
    (:func:`db_identity`) and this submission (:func:`submission_fingerprint`). Used by the
    parallel tasks and the sequential pipeline alike, so either can resume the other's run.
    """
    prev = read_record(course, assignment, student)
    _reap_previous_attempt(prev)
    attempt = int(prev.get("attempt", 0)) + 1 if prev and prev.get("state") == "running" else 1
    record = {
        "student": student, "assignment": assignment, "state": "running", "attempt": attempt,
        "host": socket.gethostname(), "worker_pid": os.getpid(), "child_pid": None,
        "child_create_time": None, "started": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "db": db_identity(db_url), "fingerprint": submission_fingerprint(course, assignment, student),
    }
    write_record(course, assignment, student, record)
    return record


def note_child(course: Course, assignment: str, student: str, record: dict, pid: int) -> None:
    """Remember the attempt's nbgrader process, so a later attempt can end it if it is orphaned."""
    try:
        import psutil

        record["child_pid"] = pid
        record["child_create_time"] = psutil.Process(pid).create_time()
        write_record(course, assignment, student, record)
    except Exception:  # noqa: BLE001 - the child may already be gone; the record is best effort
        pass


def finish_record(course: Course, assignment: str, student: str, record: dict, *, state: str,
                  seconds: float, returncode: int | None, reason: str) -> dict:
    """Close an attempt: ``state`` is ``done`` (graded to the end) or ``failed`` (see ``reason``).

    Written only after nbgrader has exited, so ``done`` means every notebook's grades are in the
    gradebook (nbgrader writes a notebook into ``autograded/`` before running it, so the files alone
    do not say that).
    """
    record.update(state=state, seconds=round(seconds, 3), returncode=returncode, reason=reason,
                  child_pid=None, finished=_dt.datetime.now(_dt.timezone.utc).isoformat())
    write_record(course, assignment, student, record)
    return record


# ----------------------------------------------------------------------------------------------
# Process helpers
# ----------------------------------------------------------------------------------------------

def _kill_tree(pid: int, create_time: float | None = None) -> None:
    """SIGKILL a process and all its descendants (the kernel runs in its own session)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1e-3:
            return  # pid reused by an unrelated process
        procs = proc.children(recursive=True) + [proc]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def _reap_previous_attempt(prev: dict | None) -> None:
    """If an earlier attempt for this student still runs on this host (orphaned nbgrader), end it."""
    if not prev or prev.get("state") != "running" or prev.get("host") != socket.gethostname():
        return
    child = prev.get("child_pid")
    if child:
        _kill_tree(int(child), prev.get("child_create_time"))


def _pdeathsig_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL --`` on Linux (the child dies with the worker), else nothing."""
    if sys.platform.startswith("linux"):
        setpriv = shutil.which("setpriv")
        if setpriv:
            return [setpriv, "--pdeathsig", "KILL", "--"]
    return []


def nbgrader_launcher() -> list[str]:
    """nbgrader's own command line, launched as the sequential pipeline launches it."""
    try:
        from .pipeline import nbgrader_command as pipeline_launcher
    except ImportError:
        return [sys.executable, "-m", "nbgrader"]
    return pipeline_launcher()


def nbgrader_command(assignment: str, student: str, db_url: str) -> list[str]:
    """The real per-student autograde command (``--force``: a retry regrades from scratch)."""
    student_arg = glob.escape(student) if glob.has_magic(student) else student
    return nbgrader_launcher() + ["autograde", assignment, f"--student={student_arg}", "--force",
                                  f"--CourseDirectory.db_url={db_url}"]


_ERROR_LINE = re.compile(r"^\[\w+ \| (ERROR|CRITICAL)\] (.*)$")
_BOILERPLATE = (
    "There was an error processing assignment",
    "Please see the",
)


def failure_reason(output: str, returncode: int | None) -> str:
    """A one-line reason for a failed run, worded like the sequential pipeline's when it can be."""
    try:
        from .pipeline import CommandRun, _reason

        reason = _reason(CommandRun([], returncode if returncode is not None else -1, 0.0, output))
        if reason and not reason.startswith("nbgrader exited with code"):
            return reason  # the same words as the sequential pipeline (reports compare equal)
    except ImportError:  # pipeline without that helper: fall back to our own parsing
        pass
    errors: list[str] = []
    exception = ""
    for line in output.splitlines():
        m = _ERROR_LINE.match(line.strip())
        if m and not any(m.group(2).startswith(b) for b in _BOILERPLATE):
            errors.append(m.group(2).strip())
        stripped = line.strip()
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Died)\b.*", stripped) and ":" in stripped:
            exception = stripped
    parts = []
    if errors:
        parts.append(errors[0])
    if exception and (not errors or exception not in errors[0]):
        parts.append(exception)
    if not parts:
        tail = [ln.strip() for ln in output.splitlines() if ln.strip()]
        parts.append(tail[-1] if tail else "no output")
    reason = " | ".join(parts)
    if returncode is not None:
        reason = f"nbgrader exit {returncode}: {reason}"
    return reason[:400]


def _notes(output: str, course: Course, assignment: str, student: str, ok: bool) -> list[str]:
    """Non-fatal problems, as the sequential pipeline reports them (missing notebook, cell timeouts)."""
    try:
        from .pipeline import _NOTE_PATTERNS, _cell_timeouts, _log_lines
    except ImportError:
        return []
    notes = [f"{why}: {w}" for w in _log_lines(output, "WARNING")
             for needle, why in _NOTE_PATTERNS if needle in w]
    if ok:
        notes.extend(_cell_timeouts(Path(course.path(course.autograded_directory, student, assignment))))
    return notes


# ----------------------------------------------------------------------------------------------
# The task: one student
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Everything a worker needs to grade one student (picklable, no open handles)."""

    course: Course
    assignment: str
    db_url: str  # the worker URL (SQLite with busy timeout)
    timeout: float = DEFAULT_STUDENT_TIMEOUT


def autograde_student(spec: TaskSpec, student: str) -> dict:
    """Run ``nbgrader autograde ASSIGNMENT --student ID`` once; return a plain-dict result.

    Result keys: ``student, status ('graded'|'failed'), seconds, returncode, reason, attempt,
    host, worker_pid, log``.  Raises :class:`TransientGradebookError` when nbgrader failed on a
    gradebook lock or connection problem (the caller retries once).
    """
    course, assignment = spec.course, spec.assignment
    started = time.time()
    record = begin_record(course, assignment, student, spec.db_url)
    attempt = record["attempt"]
    log_file = log_path(course, assignment, student)
    cmd = _pdeathsig_prefix() + nbgrader_command(assignment, student, spec.db_url)
    returncode: int | None = None
    timed_out = False
    with open(log_file, "w", encoding="utf-8", errors="replace") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=course.root, env=grading_env(course, spec.db_url),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        note_child(course, assignment, student, record, proc.pid)
        try:
            returncode = proc.wait(timeout=spec.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_tree(proc.pid)
            proc.wait()
        except BaseException:
            _kill_tree(proc.pid)
            proc.wait()
            raise
    seconds = time.time() - started
    with open(log_file, encoding="utf-8", errors="replace") as fh:
        output = fh.read()
    if timed_out:
        status, reason = "failed", f"timed out after {spec.timeout:g} s (whole student); killed"
    elif returncode == 0 and autograded_notebooks(course, assignment, student):
        status, reason = "graded", ""
    elif returncode == 0:
        status, reason = "failed", "nbgrader wrote no autograded notebook"
    else:
        status, reason = "failed", failure_reason(output, returncode)
    if status == "failed" and not timed_out and any(p in output for p in _TRANSIENT_PATTERNS):
        # state stays 'running': keeps the attempt count for the retry
        finish_record(course, assignment, student, record, state="running", seconds=seconds,
                      returncode=returncode, reason="transient gradebook error: " + reason)
        raise TransientGradebookError(f"{student}: {reason}")
    finish_record(course, assignment, student, record, state="done" if status == "graded" else "failed",
                  seconds=seconds, returncode=returncode, reason=reason)
    return {"student": student, "assignment": assignment, "status": status, "seconds": seconds,
            "returncode": returncode, "reason": reason, "attempt": attempt,
            "host": record["host"], "worker_pid": os.getpid(), "log": log_file,
            "notes": _notes(output, course, assignment, student, status == "graded"),
            "log_tail": "\n".join(output.splitlines()[-40:])}


def to_student_run(result: dict):
    """The sequential pipeline's :class:`~rlhf_lab.instructor.pipeline.StudentRun` for a result."""
    from .pipeline import StudentRun

    return StudentRun(student=result["student"], assignment=result["assignment"],
                      ok=result["status"] == "graded", seconds=round(result["seconds"], 3),
                      returncode=result["returncode"] if result["returncode"] is not None else -1,
                      reason=result["reason"], notes=list(result.get("notes") or []),
                      log_tail=result.get("log_tail") or "")


def _autograde_with_one_retry(spec: TaskSpec, student: str) -> dict:
    """Sequential path: the same task, retried once on a transient gradebook error."""
    try:
        return autograde_student(spec, student)
    except TransientGradebookError:
        return autograde_student(spec, student)


# ----------------------------------------------------------------------------------------------
# Gradebook preparation and read-back
# ----------------------------------------------------------------------------------------------

def _with_venv_path():
    """Context: venv ``bin`` first on PATH (nbgrader's Gradebook calls the bare ``alembic``)."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        old = os.environ.get("PATH", "")
        if old.split(os.pathsep)[0] != venv_bin():
            os.environ["PATH"] = venv_bin() + os.pathsep + old
        try:
            yield
        finally:
            os.environ["PATH"] = old
    return cm()


def record_assignment_from_source(course: Course, assignment: str, db_url: str) -> None:
    """Put the assignment (notebooks, cells, checksums) into a gradebook that lacks it.

    Runs ``nbgrader generate_assignment`` with the release written to a scratch folder, so the
    committed ``release/`` is not touched.
    """
    with tempfile.TemporaryDirectory(prefix="rlhf-release-") as scratch:
        cmd = nbgrader_launcher() + ["generate_assignment", assignment, "--force",
               f"--CourseDirectory.db_url={db_url}",
               f"--CourseDirectory.release_directory={scratch}"]
        proc = subprocess.run(cmd, cwd=course.root, env=grading_env(course, db_url),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ParallelGradingError(
                f"assignment {assignment!r} is not in the gradebook and recording it from "
                f"{course.source_directory}/ failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def ensure_release(course: Course, assignment: str) -> None:
    """Make sure ``release/<assignment>/`` exists (the integrity pre-flight compares against it).

    A course graded from ``source/`` alone gets the release nbgrader would hand out, generated
    with a throwaway gradebook so the real one is not touched."""
    release = Path(course.root) / "release" / assignment
    if release.is_dir():
        return
    with tempfile.TemporaryDirectory(prefix="rlhf-release-db-") as scratch:
        db = "sqlite:///" + os.path.join(scratch, "gradebook.db")
        cmd = nbgrader_launcher() + ["generate_assignment", assignment, "--force",
                                     f"--CourseDirectory.db_url={db}"]
        proc = subprocess.run(cmd, cwd=course.root, env=grading_env(course, db),
                              capture_output=True, text=True)
    if proc.returncode != 0 or not release.is_dir():
        raise ParallelGradingError(
            f"release/{assignment} is missing and generating it from {course.source_directory}/ "
            f"failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def prepare_gradebook(course: Course, assignment: str, students: Sequence[str], db_url: str) -> set[str]:
    """Initialise the gradebook ONCE before any worker touches it; return students with a submission.

    Creates the schema and alembic version row (first use), the course rows (the course's and
    nbgrader's ``default_course``), records the assignment when it is missing, and creates every
    student row, so that concurrent workers only ever update rows that exist (no racing
    ``CREATE TABLE`` or duplicate inserts).
    """
    from nbgrader.api import Gradebook, MissingEntry

    with _with_venv_path():
        # nbgrader's preprocessors open the gradebook without a course id, which inserts the
        # course row 'default_course' on first use: create it here, not in racing workers
        Gradebook(db_url).close()
        with Gradebook(db_url, course.course_id) as gb:
            try:
                gb.find_assignment(assignment)
                have_assignment = True
            except MissingEntry:
                have_assignment = False
        if not have_assignment:
            record_assignment_from_source(course, assignment, db_url)
        with Gradebook(db_url, course.course_id) as gb:
            gb.find_assignment(assignment)
            for student in students:
                gb.update_or_create_student(student)
            return {s.student.id for s in gb.find_assignment(assignment).submissions}


def read_scores(db_url: str, course_id: str, assignment: str) -> dict[str, tuple[float, float]]:
    """``{student: (score, max_score)}`` for every submission of ``assignment`` in the gradebook."""
    from nbgrader.api import Gradebook

    with _with_venv_path(), Gradebook(db_url, course_id) as gb:
        return {s.student.id: (float(s.score), float(s.max_score))
                for s in gb.find_assignment(assignment).submissions}


def sqlite_integrity(db_url: str) -> str:
    """``PRAGMA integrity_check`` of a SQLite gradebook ('ok' when sound)."""
    import sqlite3

    path = sqlite_path(db_url)
    con = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT)
    try:
        return "; ".join(str(r[0]) for r in con.execute("PRAGMA integrity_check").fetchall())
    finally:
        con.close()


# ----------------------------------------------------------------------------------------------
# Progress and the final table
# ----------------------------------------------------------------------------------------------

def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "--"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Progress:
    """Plain-text progress: a bar, graded / failed / remaining counts, rate and ETA.

    On a terminal the line is rewritten in place; in a log every update is its own line.
    """

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 24,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.width, self.clock = total, width, clock
        self.stream = stream if stream is not None else sys.stderr
        self.graded = self.failed = 0
        self.start = clock()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    @property
    def done(self) -> int:
        return self.graded + self.failed

    def eta(self) -> float | None:
        """Remaining × observed wall time per finished student (the measured class throughput)."""
        if self.done == 0:
            return None
        return (self.clock() - self.start) / self.done * (self.total - self.done)

    def line(self, last: str = "") -> str:
        filled = int(self.width * self.done / self.total) if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = self.clock() - self.start
        rate = self.done / elapsed * 60 if elapsed > 0 and self.done else 0.0
        text = (f"[{bar}] {self.done}/{self.total}  graded {self.graded}  failed {self.failed}  "
                f"remaining {self.total - self.done}  {rate:.1f}/min  elapsed "
                f"{_fmt_duration(elapsed)}  ETA {_fmt_duration(self.eta())}")
        return text + (f"  | {last}" if last else "")

    def update(self, result: dict) -> None:
        if result["status"] == "graded":
            self.graded += 1
        else:
            self.failed += 1
        last = f"{result['student']} {result['status']} {result['seconds']:.1f}s"
        self.write(self.line(last))

    def write(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + text + ("\n" if self.done == self.total else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


@dataclasses.dataclass
class ClassRun:
    """The outcome of grading one assignment for a class."""

    assignment: str
    mode: str  # 'sequential' | 'parallel'
    workers: int
    db: str
    results: list[dict]  # one per student graded in this run (see autograde_student)
    skipped: dict[str, tuple[float, float] | None]  # already graded: {student: (score, max)}
    wall_seconds: float
    integrity: str | None = None  # SQLite ``PRAGMA integrity_check``

    @property
    def graded(self) -> list[dict]:
        return [r for r in self.results if r["status"] == "graded"]

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.results if r["status"] == "failed"]

    def per_minute(self) -> float:
        """Students finished (graded or failed) per minute of wall time."""
        return len(self.results) / self.wall_seconds * 60 if self.wall_seconds > 0 else 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"students_per_minute": self.per_minute()}


def format_table(run: ClassRun) -> str:
    """Per student: status, score / max, time, attempt, reason for a failure; then a summary."""
    rows = []
    for r in run.results:
        score = f"{r['score']:g}/{r['max_score']:g}" if r.get("score") is not None else "-"
        reason = r.get("reason") or ""
        if r["status"] == "graded" and r.get("attempt", 1) and r.get("attempt", 1) > 1:
            reason = f"regraded (attempt {r['attempt']}) after an interrupted attempt"
        rows.append((r["student"], r["status"], score, f"{r['seconds']:.1f}s",
                     str(r.get("attempt") or "-"), reason))
    for student, score in run.skipped.items():
        rows.append((student, "skipped", f"{score[0]:g}/{score[1]:g}" if score else "-", "-", "-",
                     "already graded (use --force to regrade)"))
    rows.sort(key=lambda row: row[0])
    header = ("student", "status", "score", "time", "try", "reason")
    widths = [max(len(row[i]) for row in rows + [header]) for i in range(5)]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row[:5], widths)) + "  " + row[5]  # noqa: E731
    lines = [fmt(header).rstrip(), "  ".join("-" * w for w in widths) + "  ------"]
    lines += [fmt(row).rstrip() for row in rows]
    lines.append("")
    lines.append(
        f"{run.assignment}: {len(run.graded)} graded, {len(run.failed)} failed, "
        f"{len(run.skipped)} skipped in {_fmt_duration(run.wall_seconds)} "
        f"({run.mode}, {run.workers} worker{'s' if run.workers != 1 else ''}, "
        f"{run.per_minute():.1f} students/min); gradebook {run.db}"
        + (f"; SQLite integrity_check: {run.integrity}" if run.integrity else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------------

def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _result_from_exception(assignment: str, student: str, exc: BaseException,
                           started: float) -> dict:
    from distributed import KilledWorker

    if isinstance(exc, KilledWorker):
        reason = "worker died twice while grading this student (KilledWorker); not retried again"
    elif isinstance(exc, TransientGradebookError):
        reason = f"gradebook error after one retry: {exc}"
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return {"student": student, "assignment": assignment, "status": "failed",
            "seconds": time.monotonic() - started, "returncode": None, "reason": reason[:400],
            "attempt": None, "host": None, "worker_pid": None, "log": None, "notes": [],
            "log_tail": ""}


def _check_sqlite_hosts(client, db_url: str) -> None:
    """SQLite's file locks are only reliable on one machine: refuse workers on other hosts."""
    if not is_sqlite(db_url):
        return
    here = socket.gethostname()
    hosts = client.run(socket.gethostname)
    remote = sorted({h for h in hosts.values() if h != here})
    if remote:
        raise ParallelGradingError(
            f"the SQLite gradebook ({db_identity(db_url)}) can only be written safely from one "
            f"machine, but workers run on {', '.join(remote)}; grade with "
            "--db postgresql://USER@HOST/DB (or --sequential, or a LocalCluster on this host)")


def _run_dask(spec: TaskSpec, students: list[str], client, progress: Progress,
              on_result: Callable[[dict], None] | None) -> list[dict]:
    from distributed import as_completed

    started = time.monotonic()
    futures = client.map(autograde_student, [spec] * len(students), students,
                         key=[f"autograde-{spec.assignment}-{i}-{hashlib.sha1(s.encode()).hexdigest()[:10]}"
                              f"-{time.time_ns()}" for i, s in enumerate(students)],
                         retries=1, pure=False)
    student_of = {f.key: s for f, s in zip(futures, students)}
    results = []
    try:
        for fut in as_completed(futures):
            student = student_of[fut.key]
            try:
                result = fut.result()
            except Exception as exc:  # KilledWorker, TransientGradebookError after the retry, ...
                result = _result_from_exception(spec.assignment, student, exc, started)
            results.append(result)
            progress.update(result)
            if on_result:
                on_result(result)
    except BaseException:
        client.cancel(futures, force=True)
        raise
    return results


def grade_class(assignment: str, *, root: str | os.PathLike | None = None, db_url: str | None = None,
                students: Sequence[str] | None = None, sequential: bool = False,
                workers: int | None = None, scheduler: str | None = None, client=None,
                force: bool = False, timeout: float = DEFAULT_STUDENT_TIMEOUT,
                stream: TextIO | None = None,
                on_result: Callable[[dict], None] | None = None,
                preflight: bool = True, compile_cache: bool = True) -> ClassRun:
    """Autograde every (or the given) student of ``assignment``; see the module docstring.

    Before any student runs, as in the sequential pipeline: ``preflight`` runs the integrity
    checks (:func:`rlhf_lab.instructor.integrity.preflight`: malformed or hostile files are
    quarantined, students whose folder nbgrader cannot address are reported as failed with the
    reason) and, after grading, withholds the points of blocked cells; ``compile_cache`` builds or
    reuses the assignment's trusted JAX compilation cache seed
    (:mod:`rlhf_lab.instructor.compile_cache`), which every grading kernel copies privately.

    ``client`` (a ``distributed.Client``) takes precedence over ``scheduler``; with neither, a
    LocalCluster of ``workers`` processes (default: the usable cores), one thread each, is
    started and shut down.  ``on_result`` is called with each student's result as it arrives.
    """
    stream = stream if stream is not None else sys.stderr
    course = load_course(root, db_url)
    db_url = course.db_url
    _check_course_config(course, db_url)
    all_students = find_students(course, assignment)
    if students is not None and not list(students):
        return ClassRun(assignment, "sequential" if sequential else "parallel", 0,
                        db_identity(db_url), [], {}, 0.0)
    if students is not None:
        missing = sorted(set(students) - set(all_students))
        if missing:
            raise ParallelGradingError(
                f"no submission folder for {', '.join(missing)} under "
                f"{course.path(course.submitted_directory, '<student>', assignment)}")
        all_students = sorted(students)
    if not all_students:
        raise ParallelGradingError(
            f"no submissions found for {assignment!r} under "
            f"{course.path(course.submitted_directory, '*', assignment)}")

    submitted_in_db = prepare_gradebook(course, assignment, all_students, db_url)
    if force:
        todo, skipped = list(all_students), []
    else:
        todo = [s for s in all_students
                if not is_completed(course, assignment, s, db_url, submitted_in_db)]
        skipped = [s for s in all_students if s not in todo]
    spec = TaskSpec(course=course, assignment=assignment, db_url=worker_db_url(db_url),
                    timeout=timeout)
    if skipped:
        stream.write(f"{len(skipped)} student(s) already graded, skipping (use --force to regrade)\n")
    started = time.monotonic()
    results: list[dict] = []
    report = None
    if preflight and todo:
        from . import integrity

        ensure_release(course, assignment)
        report = integrity.preflight(assignment, course.root, todo)
        blocked = set(report.ungradable())
        for student in sorted(blocked & set(todo)):
            why = "; ".join(f.message for f in report.for_student(student)) or "cannot be graded"
            results.append({"student": student, "assignment": assignment, "status": "failed",
                            "seconds": 0.0, "returncode": None, "reason": f"integrity pre-flight: {why}"[:400],
                            "attempt": None, "host": None, "worker_pid": None, "log": None, "notes": [],
                            "log_tail": ""})
        todo = [s for s in todo if s not in blocked]
        n_findings = len(report.findings)
        if n_findings:
            stream.write(f"integrity pre-flight: {n_findings} finding(s) in {len(todo) + len(blocked)} "
                         f"submission(s); details in integrity/{assignment}.json\n")
    if compile_cache and todo:
        from . import compile_cache as cc

        seed = cc.ensure_seed(course.root, assignment)
        if seed.problem:
            stream.write(f"compile cache: none ({seed.problem}); kernels compile from scratch\n")
        elif seed.rebuilt:
            stream.write(f"compile cache: seed built from the source notebooks in {seed.seconds:.0f} s "
                         f"({seed.entries} programs)\n")
    progress = Progress(len(todo), stream)
    n_workers = 1
    if todo and sequential:
        stream.write(f"grading {len(todo)} student(s) of {assignment} sequentially\n")
        for student in todo:
            t0 = time.monotonic()
            try:
                result = _autograde_with_one_retry(spec, student)
            except TransientGradebookError as exc:
                result = _result_from_exception(assignment, student, exc, t0)
            results.append(result)
            progress.update(result)
            if on_result:
                on_result(result)
    elif todo:
        results, n_workers = _grade_on_dask(spec, todo, client=client, scheduler=scheduler,
                                            workers=workers, progress=progress, stream=stream,
                                            on_result=on_result)
    if report is not None:
        from . import integrity

        integrity.apply_overrides(report, course.root, db_url)
    wall = time.monotonic() - started
    scores = read_scores(db_url, course.course_id, assignment)
    for r in results:
        if r["status"] == "graded" and r["student"] in scores:
            r["score"], r["max_score"] = scores[r["student"]]
    run = ClassRun(assignment=assignment, mode="sequential" if sequential else "parallel",
                   workers=n_workers, db=db_identity(db_url), results=results,
                   skipped={s: scores.get(s) for s in skipped}, wall_seconds=wall)
    if is_sqlite(db_url):
        run.integrity = sqlite_integrity(db_url)
    return run


def _check_course_config(course: Course, db_url: str) -> None:
    """The course pipeline's config check (nbgrader only *warns* when its config fails to load)."""
    try:
        from .pipeline import PipelineError, check_config
    except ImportError:
        return
    try:
        check_config(course.root, db_url)
    except PipelineError as exc:
        raise ParallelGradingError(str(exc)) from exc


def dask_grader(*, workers: int | None = None, scheduler: str | None = None, client=None,
                timeout: float = DEFAULT_STUDENT_TIMEOUT, stream: TextIO | None = None):
    """A ``grader`` for :func:`rlhf_lab.instructor.pipeline.run_class` that fans out on Dask.

    ``run_class(subs, grader=dask_grader())`` runs the whole pipeline with the autograde step in
    parallel; the callable returns the pipeline's ``StudentRun`` list.
    """
    def grader(assignment, students, root, db_url, force):
        # run_class has run the integrity pre-flight (and removed the students it quarantined):
        # a second one here would rewrite integrity/<assignment>.json for the remaining students only
        run = grade_class(assignment, root=root, db_url=db_url, students=list(students),
                          workers=workers, scheduler=scheduler, client=client, force=force,
                          timeout=timeout, stream=stream, preflight=False)
        return [to_student_run(r) for r in run.results]
    return grader


DASK_SETTINGS = {
    # a student whose worker dies is regraded once elsewhere; a second death fails that student
    "distributed.scheduler.allowed-failures": 1,
    # long tasks: hand each worker one student at a time (no queue behind a slow submission)
    "distributed.scheduler.worker-saturation": 1.0,
}


def make_local_cluster(n_workers: int):
    """A LocalCluster on 127.0.0.1: ``n_workers`` processes (each with a nanny that restarts it
    if it dies), one thread each, no dashboard, the retry settings of :data:`DASK_SETTINGS`."""
    import dask
    from distributed import LocalCluster

    with dask.config.set(DASK_SETTINGS):
        return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                            host="127.0.0.1", dashboard_address=None, scheduler_port=0,
                            silence_logs=40)


def _grade_on_dask(spec: TaskSpec, todo: list[str], *, client, scheduler, workers, progress,
                   stream, on_result) -> tuple[list[dict], int]:
    from distributed import Client

    own_cluster = own_client = None
    try:
        if client is None and scheduler:
            client = own_client = Client(scheduler)
        elif client is None:
            own_cluster = make_local_cluster(workers or default_workers())
            client = own_client = Client(own_cluster)
        n_workers = len(client.scheduler_info()["workers"]) or (workers or 0)
        _check_sqlite_hosts(client, spec.db_url)
        stream.write(f"grading {len(todo)} student(s) of {spec.assignment} on {n_workers} "
                     f"Dask worker(s) at {client.scheduler.address}\n")
        stream.flush()
        return _run_dask(spec, todo, client, progress, on_result), n_workers
    finally:
        if own_client is not None:
            own_client.close()
        if own_cluster is not None:
            own_cluster.close()


# ----------------------------------------------------------------------------------------------
# Load-test helpers (tests and bench/bench_parallel.py build big classes with these)
# ----------------------------------------------------------------------------------------------

def copy_course(src_root: str | os.PathLike, dest_root: str | os.PathLike,
                assignments: Sequence[str]) -> Path:
    """A fresh course at ``dest_root``: the config and ``source/<a>`` of ``src_root``, nothing graded.

    The assignments' compile cache seeds are copied too when ``src_root`` has them (each seed
    carries its own validity key: a stale one is rebuilt, never used wrongly)."""
    from .compile_cache import seed_dir

    src, dest = Path(src_root), Path(dest_root)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "nbgrader_config.py", dest / "nbgrader_config.py")
    for a in assignments:
        shutil.copytree(src / "source" / a, dest / "source" / a,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        if seed_dir(src, a).is_dir():
            shutil.copytree(seed_dir(src, a), seed_dir(dest, a))
    return dest


def replicate_class(submissions: str | os.PathLike, assignment: str, size: int,
                    dest_root: str | os.PathLike) -> list[str]:
    """Fill ``dest_root/submitted/`` with ``size`` students cycling through the example students.

    ``submissions/<student>/<assignment>/`` folders are copied as ``<student>__<k>`` (k = copy
    number, two digits), so a class of any size mixes the correct, mistaken and broken examples
    in the same proportions. Returns the new student ids.
    """
    base = Path(submissions)
    examples = sorted(p.name for p in base.iterdir() if (p / assignment).is_dir())
    if not examples:
        raise ParallelGradingError(f"no example submissions of {assignment!r} under {base}")
    ids = []
    for i in range(size):
        orig = examples[i % len(examples)]
        sid = f"{orig}__{i // len(examples):02d}"
        shutil.copytree(base / orig / assignment, Path(dest_root) / "submitted" / sid / assignment)
        ids.append(sid)
    return ids


def cheapest_assignment(root: str | os.PathLike, submissions: str | os.PathLike) -> str:
    """The graded assignment of ``root/source`` that has example submissions and is cheapest to
    grade: fewest notebooks, then fewest code cells."""
    import nbformat

    root, submissions = Path(root), Path(submissions)
    best = None
    for adir in sorted(p for p in (root / "source").iterdir() if p.is_dir()):
        nbs = sorted(adir.glob("*.ipynb"))
        if not nbs or not any((s / adir.name).is_dir() for s in submissions.iterdir()):
            continue
        cells = [nbformat.read(p, as_version=4).cells for p in nbs]
        if not any(c.metadata.get("nbgrader", {}).get("grade") for cs in cells for c in cs):
            continue
        cost = (len(nbs), sum(c.cell_type == "code" for cs in cells for c in cs))
        if best is None or cost < best[0]:
            best = (cost, adir.name)
    if best is None:
        raise ParallelGradingError(f"no graded assignment with example submissions in {submissions}")
    return best[1]


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rlhf_lab.instructor.parallel",
        description="Autograde every submitted student of an assignment, one real `nbgrader "
                    "autograde --student` per student, in parallel on Dask.")
    p.add_argument("assignment")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="use an existing Dask scheduler (tcp://host:port) instead of a LocalCluster")
    p.add_argument("--workers", type=int, metavar="N",
                   help=f"LocalCluster worker processes (default: usable cores, here {default_workers()})")
    p.add_argument("--db", metavar="URL",
                   help="gradebook URL (default: the course config, SQLite gradebook.db); "
                        "postgresql://... lets workers write concurrently")
    p.add_argument("--root", metavar="DIR", help="course root (default: $RLHF_COURSE_ROOT or the repo)")
    p.add_argument("--student", action="append", dest="students", metavar="ID",
                   help="grade only this student (repeatable)")
    p.add_argument("--sequential", action="store_true", help="plain loop, one student after another")
    p.add_argument("--force", action="store_true", help="regrade students already graded")
    p.add_argument("--timeout", type=float, default=DEFAULT_STUDENT_TIMEOUT, metavar="SECONDS",
                   help="limit for one student's whole autograde (default %(default)g)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--no-preflight", action="store_true",
                   help="skip the integrity pre-flight (quarantine of malformed or hostile files)")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="do not build or use the trusted JAX compilation cache seed")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.workers is not None and args.workers < 1:
        print("error: --workers must be at least 1", file=sys.stderr)
        return 2
    os.environ["PATH"] = venv_bin() + os.pathsep + os.environ.get("PATH", "")
    try:
        run = grade_class(args.assignment, root=args.root, db_url=args.db, students=args.students,
                          sequential=args.sequential, workers=args.workers,
                          scheduler=args.scheduler, force=args.force, timeout=args.timeout,
                          preflight=not args.no_preflight, compile_cache=not args.no_compile_cache)
    except ParallelGradingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: students already graded are kept; re-run the same command to "
              "grade the rest", file=sys.stderr)
        return 130
    print(format_table(run))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(run.to_json(), fh, indent=1, ensure_ascii=False)
    if run.integrity not in (None, "ok"):
        print(f"error: SQLite integrity check failed: {run.integrity}", file=sys.stderr)
        return 3
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
