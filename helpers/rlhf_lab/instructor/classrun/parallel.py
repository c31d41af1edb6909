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
*A front end.*  This module is the command line of one assignment's fan-out and its
:func:`grade_class`; everything it runs lives in the layers below: the course's one grading path
(:func:`~.orchestrator.grade_assignment`: the pre-flight, the per-student task
:func:`~.orchestrator.grade_submission`, the withheld points), its executors (the pool of one,
:class:`~.orchestrator.SequentialExecutor`, for ``--sequential``; the Dask pool of N,
:class:`~.executors.DaskExecutor`, otherwise), the run records (:mod:`.records`), the progress
phases (:mod:`.progress`), and the result and its table (:class:`~.pipeline.ClassRun`,
:func:`~.pipeline.format_runs`), the same as the course command's.

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
(:func:`~.executors.prepare_gradebook`: schema + alembic version, the course row and nbgrader's
implicit ``default_course`` row, the assignment recorded from ``source/`` when missing, every
student row created), so concurrent first use never races on ``CREATE TABLE`` or a duplicate
insert (PostgreSQL or SQLite).  nbgrader never keeps a database transaction open while a notebook
executes: it writes in short bursts (student and submission rows before execution, one commit per
graded cell after it), each transaction starting with its write.  For SQLite the worker URL
therefore carries a busy timeout (``?timeout=…``): a writer that finds the file locked waits for
the other writer's few-millisecond commit instead of failing, which serialises the writes through
SQLite's own file lock while the notebooks (the expensive part) run in parallel.  Anything that
still reports "database is locked" is retried (the task is idempotent), and the run ends with
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
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Sequence, TextIO

from . import progress
# The course, the run records, the task and the executors live in the layers below; they are
# re-exported here under the names this module has always offered.
from ..course import (  # noqa: F401
    DEFAULT_STUDENT_TIMEOUT, REPO_ROOT, Course, CourseError, db_identity, is_sqlite, normalise_db_url,
    sqlite_path, venv_bin,
)
from .executors import (  # noqa: F401
    DaskExecutor, ParallelGradingError, default_workers, make_local_cluster, prepare_gradebook,
)
from .orchestrator import (  # noqa: F401
    SQLITE_BUSY_TIMEOUT, SequentialExecutor, TaskSpec, TransientGradebookError, autograde_command,
    ensure_release, failure_reason, grade_assignment, grade_with_one_retry, to_student_run, worker_db_url,
)
from .orchestrator import grade_submission as autograde_student  # noqa: F401
from .pipeline import ClassRun, format_runs
from .records import (  # noqa: F401
    RUNS_DIRNAME, autograded_notebooks, begin_record, finish_record, is_completed, log_path, note_child,
    read_record, record_path, runs_dir, submission_fingerprint, write_record,
)


# ----------------------------------------------------------------------------------------------
# Course discovery
# ----------------------------------------------------------------------------------------------

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
# Gradebook read-back
# ----------------------------------------------------------------------------------------------

def read_scores(db_url: str, course_id: str, assignment: str) -> dict[str, tuple[float, float]]:
    """``{student: (score, max_score)}`` for every submission of ``assignment`` in the gradebook."""
    from nbgrader.api import Gradebook

    from ..course import ensure_venv_on_path

    ensure_venv_on_path()  # nbgrader's Gradebook calls the bare `alembic` on first use
    with Gradebook(db_url, course_id) as gb:
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
# Progress
# ----------------------------------------------------------------------------------------------

def progress_line(result: dict, graded: int, failed: int, total: int, left: str = "") -> str:
    """One line per finished student: its outcome and time, the counts so far, the time left.

    ``  graded ada 12.3 s | 3/10 done: graded 2, failed 1, remaining 7; about 1 min 05 s left``
    """
    done = graded + failed
    return (f"  {result['status']} {result['student']} {result['seconds']:.1f} s | {done}/{total} done: "
            f"graded {graded}, failed {failed}, remaining {max(0, total - done)}" + (f"; {left}" if left else ""))


def _graded_with_progress(course: Course, assignment: str, todo: list[str], executor, *, timeout: float,
                          preflight: bool, reporter: progress.Reporter, workers: int,
                          on_result: Callable[[dict], None] | None):
    """:func:`~.orchestrator.grade_assignment` inside one :mod:`.progress` phase of ``reporter``: a line
    per student (and a bar when its stream is a terminal)."""
    tally = {"graded": 0, "failed": 0}
    with reporter.phase("autograde", len(todo), unit="student", workers=workers,
                        what=f"one nbgrader autograde per student of {assignment}") as phase:
        def arrived(result: dict) -> None:
            tally["graded" if result["status"] == "graded" else "failed"] += 1
            phase.advance()
            phase.write(progress_line(result, tally["graded"], tally["failed"], len(todo), phase.postfix()))
            if on_result:
                on_result(result)

        return grade_assignment(course, assignment, todo, executor, timeout=timeout, preflight=preflight,
                                stream=progress.LineStream(reporter), on_result=arrived)


# ----------------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------------

def grade_class(assignment: str, *, root: str | os.PathLike | None = None, db_url: str | None = None,
                students: Sequence[str] | None = None, sequential: bool = False,
                workers: int | None = None, scheduler: str | None = None, client=None,
                force: bool = False, timeout: float = DEFAULT_STUDENT_TIMEOUT,
                stream: TextIO | None = None,
                on_result: Callable[[dict], None] | None = None,
                preflight: bool = True, compile_cache: bool = True) -> ClassRun:
    """Autograde every (or the given) student of ``assignment``; see the module docstring.

    The course's one grading path (:func:`~.orchestrator.grade_assignment`) with a
    :class:`~.executors.DaskExecutor` (or, ``sequential``, the pool of one): ``preflight`` runs the
    integrity checks first (students whose folder cannot be graded are reported as failed with the
    reason) and withholds the points of blocked cells after grading; ``compile_cache`` builds or
    reuses the assignment's trusted JAX compilation cache seed (:mod:`.compile_cache`).

    Students already graded (their run record says done for this submission and gradebook) are
    skipped unless ``force``. ``on_result`` is called with each student's result as it arrives.
    Returns the course's :class:`~.pipeline.ClassRun` (``runs``, ``results`` with each graded
    student's ``score``, ``skipped``, ``mode``, ``workers``, ``wall_seconds``, ``sqlite_check``).
    """
    from .orchestrator import ensure_compile_cache

    stream = stream if stream is not None else sys.stderr
    course = load_course(root, db_url)
    db_url = course.db_url
    mode = "sequential" if sequential else "parallel"
    _check_course_config(course, db_url)
    all_students = find_students(course, assignment)
    if students is not None and not list(students):
        return ClassRun(course.path_root, db_url, [assignment], [], workers=0, mode=mode)
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
    # one reporter on ``stream`` for the phase's lines and bar, and what the executor says meanwhile
    reporter = progress.Reporter(out=stream, err=stream)
    executor = SequentialExecutor() if sequential else DaskExecutor(
        client=client, scheduler=scheduler, workers=workers, stream=progress.LineStream(reporter))
    report, results = None, []
    if todo:
        try:
            with executor:
                done = _graded_with_progress(
                    course, assignment, todo, executor, timeout=timeout, preflight=preflight, reporter=reporter,
                    workers=1 if sequential or scheduler or client else (workers or default_workers()),
                    on_result=on_result)
        except ParallelGradingError:
            raise
        except CourseError as exc:
            raise ParallelGradingError(str(exc)) from exc
        report, results = done.report, done.results
    wall = time.monotonic() - started
    scores = read_scores(db_url, course.course_id, assignment)
    for r in results:
        if r["status"] == "graded" and r["student"] in scores:
            r["score"], r["max_score"] = scores[r["student"]]
    return ClassRun(course.path_root, db_url, [assignment], [to_student_run(r) for r in results],
                    integrity={assignment: report} if report is not None else {},
                    workers=executor.workers if todo else 1, mode=mode, results=results,
                    skipped={s: scores.get(s) for s in skipped}, wall_seconds=wall,
                    sqlite_check=sqlite_integrity(db_url) if is_sqlite(db_url) else None)


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
        return list(run.runs)
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
    print(format_runs(run))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(run.to_json(), fh, indent=1, ensure_ascii=False)
    if run.sqlite_check not in (None, "ok"):
        print(f"error: SQLite integrity check failed: {run.sqlite_check}", file=sys.stderr)
        return 3
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
