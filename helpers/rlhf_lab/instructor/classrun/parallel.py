"""Grade a whole class in parallel: one real ``nbgrader autograde`` per student, fanned out on Dask.

Usage (from the course root, with the virtual environment's ``bin`` first on PATH)::

    python -m rlhf_lab.instructor.classrun.parallel ASSIGNMENT                    # LocalCluster sized to the machine
    python -m rlhf_lab.instructor.classrun.parallel ASSIGNMENT --workers 4
    python -m rlhf_lab.instructor.classrun.parallel ASSIGNMENT --scheduler tcp://host:8786   # existing cluster
    python -m rlhf_lab.instructor.classrun.parallel ASSIGNMENT --db postgresql://user@host/gradebook
    python -m rlhf_lab.instructor.classrun.parallel ASSIGNMENT --sequential       # the plain loop, no Dask
    python -m rlhf_lab.instructor.classrun.parallel ASSIGNMENT --force            # regrade everyone

Design
------
*One grading path.*  This module is the Dask executor (:class:`DaskExecutor`, a pool of N) of
the course's orchestrator (:mod:`.orchestrator`): the sequential pipeline and this command run the
same pre-flight, the same per-student task (:func:`~.orchestrator.grade_submission`) and the same
run records (:mod:`.records`); ``--sequential`` is the pool of one.

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
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence, TextIO

# The course, the run records and the task live in the layers below; they are re-exported here
# under the names this module has always offered.
from ..course import (  # noqa: F401
    DEFAULT_STUDENT_TIMEOUT, REPO_ROOT, Course, CourseError, db_identity, is_sqlite, normalise_db_url,
    sqlite_path, venv_bin,
)
from ..course import nbgrader_command as nbgrader_launcher  # noqa: F401
from .orchestrator import (  # noqa: F401
    SQLITE_BUSY_TIMEOUT, SequentialExecutor, TaskSpec, TransientGradebookError, autograde_command,
    ensure_release, failure_reason, grade_assignment, grade_with_one_retry, to_student_run, worker_db_url,
)
from .orchestrator import _TRANSIENT_PATTERNS  # noqa: F401
from .orchestrator import grade_submission as autograde_student  # noqa: F401
from .records import (  # noqa: F401
    RUNS_DIRNAME, autograded_notebooks, begin_record, finish_record, is_completed, log_path, note_child,
    read_record, record_path, runs_dir, submission_fingerprint, write_record,
)
from .records import kill_tree as _kill_tree  # noqa: F401


class ParallelGradingError(CourseError):
    """A configuration problem that stops the whole run (clear message, nothing graded)."""


# ----------------------------------------------------------------------------------------------
# Course discovery
# ----------------------------------------------------------------------------------------------

def grading_env(course: Course, db_url: str | None = None) -> dict[str, str]:
    """Environment for nbgrader subprocesses (:meth:`Course.env`)."""
    return course.env(db_url)


def load_course(root: str | os.PathLike | None = None, db_url: str | None = None) -> Course:
    """:meth:`Course.load`, with a problem reported as :class:`ParallelGradingError`."""
    try:
        return Course.load(root, db_url)
    except ParallelGradingError:
        raise
    except CourseError as exc:
        raise ParallelGradingError(str(exc)) from exc


def find_students(course: Course, assignment: str) -> list[str]:
    """Student ids that have ``submitted/<id>/<assignment>/`` (sorted)."""
    import glob

    template = course.path(course.submitted_directory, "\0", assignment)
    head, tail = template.split("\0", 1)
    regexp = re.compile(re.escape(head) + "(.+)" + re.escape(tail))
    students = []
    for path in glob.glob(glob.escape(head) + "*" + glob.escape(tail)):
        m = regexp.fullmatch(path)
        if m and os.path.isdir(path):
            students.append(m.group(1))
    return sorted(students)


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
    from .orchestrator import failed_result

    return failed_result(assignment, student, reason, time.monotonic() - started)


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


DASK_SETTINGS = {
    # a student whose worker dies is regraded once elsewhere; a second death fails that student
    "distributed.scheduler.allowed-failures": 1,
    # long tasks: hand each worker one student at a time (no queue behind a slow submission)
    "distributed.scheduler.worker-saturation": 1.0,
    # no statistical profiler in the workers: nobody reads its profiles (no dashboard), and on
    # Python 3.11 its sampling of a running task's frames fails now and then ("'dict' object has no
    # attribute 'f_code'"), a traceback in the middle of the grading output
    "distributed.worker.profile.enabled": False,
}


def make_local_cluster(n_workers: int):
    """A LocalCluster on 127.0.0.1: ``n_workers`` processes (each with a nanny that restarts it
    if it dies), one thread each, no dashboard, the retry settings of :data:`DASK_SETTINGS` and no
    worker profiler (each nanny hands the configuration it was created with to its worker)."""
    import dask
    from distributed import LocalCluster

    with dask.config.set(DASK_SETTINGS):
        return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                            host="127.0.0.1", dashboard_address=None, scheduler_port=0,
                            silence_logs=40)


class DaskExecutor:
    """A pool of N: each student's :func:`~.orchestrator.grade_submission` is one Dask task.

    ``client`` (a ``distributed.Client``) takes precedence over ``scheduler`` (an address); with
    neither, a LocalCluster of ``workers`` processes (default: the usable cores) is started for the
    run and shut down after it. A task is retried once on a transient gradebook error
    (``retries=1``); a task whose worker died twice fails that student alone.

    With ``judge_server`` (default: unless ``RLHF_JUDGE_SERVER=0``) each worker process starts one
    judge server on its first task (:mod:`.judge_server`) and keeps it for the run; it is stopped on
    every worker when the run ends.
    """

    mode = "parallel"

    def __init__(self, *, client=None, scheduler: str | None = None, workers: int | None = None,
                 stream: TextIO | None = None, judge_server: bool | None = None):
        self.client, self.scheduler, self.requested = client, scheduler, workers
        self.judge_server = judge_server
        self.workers = workers or 0
        self.stream = stream

    def describe(self, spec: TaskSpec, n: int) -> str:
        return ""  # said by run() once the cluster is up (how many workers, where)

    def run(self, spec: TaskSpec, students: Sequence[str],
            on_result: Callable[[dict], None] | None = None) -> list[dict]:
        from distributed import Client

        from ..grader import judge_server

        serve = judge_server.enabled() if self.judge_server is None else self.judge_server
        spec = dataclasses.replace(spec, judge_server=serve)
        own_cluster = own_client = None
        client = self.client
        try:
            if client is None and self.scheduler:
                client = own_client = Client(self.scheduler)
            elif client is None:
                own_cluster = make_local_cluster(self.requested or default_workers())
                client = own_client = Client(own_cluster)
            self.workers = len(client.scheduler_info()["workers"]) or (self.requested or 0)
            _check_sqlite_hosts(client, spec.db_url)
            if self.stream is not None:
                self.stream.write(f"grading {len(students)} student(s) of {spec.assignment} on {self.workers} "
                                  f"Dask worker(s) at {client.scheduler.address}\n")
                self.stream.flush()
            return _run_dask(spec, list(students), client, on_result)
        finally:
            if serve and client is not None:
                try:
                    client.run(judge_server.stop_shared)
                except Exception as exc:  # noqa: BLE001 - a worker that is gone took its server with it
                    if self.stream is not None:
                        self.stream.write(f"could not stop the workers' judge servers: {exc}\n")
            if own_client is not None:
                own_client.close()
            if own_cluster is not None:
                own_cluster.close()


def _run_dask(spec: TaskSpec, students: list[str], client,
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

    The course's one grading path (:func:`~.orchestrator.grade_assignment`) with a
    :class:`DaskExecutor` (or, ``sequential``, the pool of one): ``preflight`` runs the integrity
    checks first (students whose folder cannot be graded are reported as failed with the reason)
    and withholds the points of blocked cells after grading; ``compile_cache`` builds or reuses the
    assignment's trusted JAX compilation cache seed (:mod:`.compile_cache`).

    Students already graded (their run record says done for this submission and gradebook) are
    skipped unless ``force``. ``on_result`` is called with each student's result as it arrives.
    """
    from .orchestrator import ensure_compile_cache

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
    if skipped:
        stream.write(f"{len(skipped)} student(s) already graded, skipping (use --force to regrade)\n")
    started = time.monotonic()
    if compile_cache and todo:
        ensure_compile_cache(course, [assignment], stream)
    executor = SequentialExecutor() if sequential else DaskExecutor(client=client, scheduler=scheduler,
                                                                   workers=workers, stream=stream)
    progress = Progress(len(todo), stream)

    def arrived(result: dict) -> None:
        progress.update(result)
        if on_result:
            on_result(result)

    try:
        done = grade_assignment(course, assignment, todo, executor, timeout=timeout, preflight=preflight,
                                stream=stream, on_result=arrived)
    except ParallelGradingError:
        raise
    except CourseError as exc:
        raise ParallelGradingError(str(exc)) from exc
    results = done.results
    wall = time.monotonic() - started
    scores = read_scores(db_url, course.course_id, assignment)
    for r in results:
        if r["status"] == "graded" and r["student"] in scores:
            r["score"], r["max_score"] = scores[r["student"]]
    run = ClassRun(assignment=assignment, mode="sequential" if sequential else "parallel",
                   workers=executor.workers if todo else 1, db=db_identity(db_url), results=results,
                   skipped={s: scores.get(s) for s in skipped}, wall_seconds=wall)
    if is_sqlite(db_url):
        run.integrity = sqlite_integrity(db_url)
    return run


def _check_course_config(course: Course, db_url: str) -> None:
    """The course's config check (nbgrader only *warns* when its config fails to load)."""
    from ..course import PipelineError, check_config

    try:
        check_config(course.root, db_url)
    except PipelineError as exc:
        raise ParallelGradingError(str(exc)) from exc


def dask_grader(*, workers: int | None = None, scheduler: str | None = None, client=None,
                timeout: float = DEFAULT_STUDENT_TIMEOUT, stream: TextIO | None = None):
    """A ``grader`` for :func:`rlhf_lab.instructor.classrun.pipeline.run_class` that fans out on Dask.

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


# ----------------------------------------------------------------------------------------------
# Load-test helpers (tests and bench/bench_parallel.py build big classes with these)
# ----------------------------------------------------------------------------------------------

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
        prog="python -m rlhf_lab.instructor.classrun.parallel",
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
    except CourseError as exc:  # ParallelGradingError included
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
