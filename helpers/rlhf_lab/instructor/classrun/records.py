"""Run records: which (student, assignment) autograde runs finished, so a re-run grades only the rest.

Each attempt keeps a small JSON record in ``<root>/.autograde_runs/<assignment>/<student>.json``
(state ``running``/``done``/``failed``, attempt number, host, pids, times, reason, a fingerprint of
the submitted files and the gradebook it wrote to) next to nbgrader's log of the run
(``<student>.log``). Whatever executor ran the attempt (one process after another, or a Dask
worker) writes the same record, so either can resume the other's run.

A student counts as completed (:func:`is_completed`) when the record says ``done`` for this
gradebook and exactly this submission, the autograded notebooks exist and the gradebook has the
submission. Files in ``autograded/`` alone prove nothing: nbgrader writes each notebook there
before running it, so a run killed in the middle of a notebook leaves it with empty grades.
"""
from __future__ import annotations

import datetime as _dt
import glob
import hashlib
import json
import os
import signal
import socket
import tempfile
import urllib.parse

from ..grader import safe_files
from ..course import COURSE_ID, Course, db_identity, ensure_venv_on_path

RUNS_DIRNAME = ".autograde_runs"


def submission_fingerprint(course: Course, assignment: str, student: str) -> str:
    """sha256 over the submitted files (relative names and bytes): changes when a student resubmits.
    Links and special files count by their kind (never followed, never opened)."""
    base = course.path(course.submitted_directory, student, assignment)
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            digest.update(os.path.relpath(full, base).encode("utf-8", "surrogateescape") + b"\0")
            try:  # never through a link, never blocking on a FIFO (safe_files.open_regular)
                with safe_files.open_regular(full, max_links=None) as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        digest.update(block)
            except safe_files.UnsafeFileError as exc:  # a link or special file: its kind, not its target
                digest.update(f"refused {exc.kind}".encode())
            except OSError as exc:  # unreadable file: still a stable fingerprint
                digest.update(repr(exc).encode())
            digest.update(b"\0")
    return digest.hexdigest()


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


def submissions_in_gradebook(db_url: str, assignment: str, course_id: str = COURSE_ID) -> set[str]:
    """Students with a submission of ``assignment`` in the gradebook (empty when there is none yet)."""
    from nbgrader.api import Gradebook

    try:
        ensure_venv_on_path()
        with Gradebook(db_url, course_id) as gb:
            return {s.student.id for s in gb.find_assignment(assignment).submissions}
    except Exception:  # noqa: BLE001 - no gradebook or no such assignment yet: nothing is in it
        return set()


def pending(course: Course, assignment: str, students=None) -> list[str]:
    """Of ``students`` (default: every submitted one), those whose last run did not finish."""
    students = course.submitted_students(assignment) if students is None else list(students)
    in_db = submissions_in_gradebook(course.db_url, assignment, course.course_id)
    return [s for s in students if not is_completed(course, assignment, s, course.db_url, in_db)]


def begin_record(course: Course, assignment: str, student: str, db_url: str) -> dict:
    """Start one autograde attempt: end an orphaned earlier attempt, write a ``running`` record.

    The attempt number grows while the previous record still says ``running`` (that attempt never
    finished: its process was killed). The record ties the attempt to this gradebook
    (:func:`db_identity`) and this submission (:func:`submission_fingerprint`).
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


def kill_tree(pid: int, create_time: float | None = None) -> None:
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
        kill_tree(int(child), prev.get("child_create_time"))
