"""The pools of N beside the orchestrator's pool of one: Dask for one assignment or a whole class.

:class:`.orchestrator.SequentialExecutor` runs the tasks one after another; the executors here run
the same tasks (:func:`.orchestrator.grade_submission`, one real ``nbgrader autograde --student``
per student) on Dask:

* :class:`DaskExecutor`: every ``(spec, student)`` task one Dask task, on a given client, an
  existing scheduler, or a LocalCluster of its own (:func:`make_local_cluster`) kept until the
  executor is closed (it is a context manager);
* :class:`ClassExecutor`: the pool of a whole class run, of any size: the sequential executor for
  one worker, a :class:`DaskExecutor` for more, the gradebook prepared once before the fan-out.

*Retries.*  A task is retried once when nbgrader hit a transient gradebook error (``retries=1``);
the LocalCluster's scheduler allows one worker death per task (``allowed-failures=1``), so a
student whose worker was killed is regraded once elsewhere and a second death fails that student
alone (:func:`result_from_exception`).

*Gradebook safety.*  Before the fan-out the gradebook is initialised exactly once in this process
(:func:`prepare_gradebook`: schema, the course rows, the assignment, every student row), so
concurrent first use never races on ``CREATE TABLE`` or a duplicate insert. SQLite's locking is only
safe on one machine: a SQLite gradebook is refused when a worker runs on another host
(:func:`check_sqlite_hosts`).

May import: :mod:`.orchestrator`, :mod:`.records`, :mod:`rlhf_lab.instructor.course` and
:mod:`..grader`; never the front ends (:mod:`.pipeline`, :mod:`.parallel`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import tempfile
import time
from typing import Callable, Sequence, TextIO

from ..course import Course, CourseError, db_identity, ensure_venv_on_path, is_sqlite
from .orchestrator import (Executor, SequentialExecutor, TaskSpec, TransientGradebookError, failed_result,
                           grade_submission)

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


class ParallelGradingError(CourseError):
    """A configuration problem that stops the whole run (clear message, nothing graded)."""


# ------------------------------------------------------------------------------------ the cluster
def default_workers() -> int:
    """The cores this process may use (its CPU affinity on Linux): the default pool size."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def make_local_cluster(n_workers: int):
    """A LocalCluster on 127.0.0.1: ``n_workers`` processes (each with a nanny that restarts it
    if it dies), one thread each, no dashboard, the retry settings of :data:`DASK_SETTINGS` and no
    worker profiler (each nanny hands the configuration it was created with to its worker)."""
    import warnings

    import dask
    from distributed import LocalCluster

    with dask.config.set(DASK_SETTINGS), warnings.catch_warnings():
        # the scheduler's HTTP endpoint moves to a free port when 8787 is taken (another cluster on
        # this machine): distributed says so with a warning meant for developers
        warnings.filterwarnings("ignore", message=r"Port \d+ is already in use")
        return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                            host="127.0.0.1", dashboard_address=None, scheduler_port=0,
                            silence_logs=40)


def check_sqlite_hosts(client, db_url: str) -> None:
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


# ----------------------------------------------------------------------------------- the gradebook
def record_assignment_from_source(course: Course, assignment: str, db_url: str) -> None:
    """Put the assignment (notebooks, cells, checksums) into a gradebook that lacks it.

    Runs ``nbgrader generate_assignment`` (:meth:`.Course.run_nbgrader`) with the release written
    to a scratch folder, so the committed ``release/`` is not touched.
    """
    with tempfile.TemporaryDirectory(prefix="rlhf-release-") as scratch:
        run = course.run_nbgrader(["generate_assignment", assignment, "--force",
                                   f"--CourseDirectory.db_url={db_url}",
                                   f"--CourseDirectory.release_directory={scratch}"], db_url=db_url)
    if not run.ok:
        raise ParallelGradingError(f"assignment {assignment!r} is not in the gradebook and recording it from "
                             f"{course.source_directory}/ failed:\n{run.output[-4000:]}")


def prepare_gradebook(course: Course, assignment: str, students: Sequence[str], db_url: str) -> set[str]:
    """Initialise the gradebook ONCE before any worker touches it; return students with a submission.

    Creates the schema and alembic version row (first use), the course rows (the course's and
    nbgrader's ``default_course``), records the assignment when it is missing, and creates every
    student row, so that concurrent workers only ever update rows that exist (no racing
    ``CREATE TABLE`` or duplicate inserts).
    """
    from nbgrader.api import Gradebook, MissingEntry

    ensure_venv_on_path()  # nbgrader's Gradebook calls the bare `alembic` on first use
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


# ------------------------------------------------------------------------------------ the fan-out
def task_keys(tasks: Sequence[tuple[TaskSpec, str]], now_ns: int) -> list[str]:
    """Unique Dask keys of the tasks: assignment, position, a hash of the student id, the time."""
    return [f"autograde-{spec.assignment}-{i}-{hashlib.sha1(student.encode()).hexdigest()[:10]}-{now_ns}"
            for i, (spec, student) in enumerate(tasks)]


def result_from_exception(assignment: str, student: str, exc: BaseException, started: float) -> dict:
    """The failed result of a task that raised on Dask (its worker died twice, a gradebook error
    after the retry, anything else), timed from ``started`` (:func:`time.monotonic`)."""
    from distributed import KilledWorker

    if isinstance(exc, KilledWorker):
        reason = "worker died twice while grading this student (KilledWorker); not retried again"
    elif isinstance(exc, TransientGradebookError):
        reason = f"gradebook error after one retry: {exc}"
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return failed_result(assignment, student, reason, time.monotonic() - started)


def run_on_dask(client, tasks: Sequence[tuple[TaskSpec, str]],
                on_result: Callable[[dict], None] | None = None) -> list[dict]:
    """Every ``(spec, student)`` task as one Dask task on ``client``; results in the order they finish.

    ``on_result(result)`` is called as each arrives. An interruption cancels what is left.
    """
    from distributed import as_completed

    tasks = list(tasks)
    started = time.monotonic()
    futures = client.map(grade_submission, [spec for spec, _ in tasks], [s for _, s in tasks],
                         key=task_keys(tasks, time.time_ns()), retries=1, pure=False)
    task_of = {f.key: t for f, t in zip(futures, tasks)}
    results = []
    try:
        for fut in as_completed(futures):
            spec, student = task_of[fut.key]
            try:
                result = fut.result()
            except Exception as exc:  # KilledWorker, TransientGradebookError after the retry, ...
                result = result_from_exception(spec.assignment, student, exc, started)
            results.append(result)
            if on_result is not None:
                on_result(result)
    except BaseException:
        client.cancel(futures, force=True)
        raise
    return results


# ------------------------------------------------------------------------------------ executors
class DaskExecutor(Executor):
    """A pool of N: each student's :func:`~.orchestrator.grade_submission` is one Dask task.

    ``client`` (a ``distributed.Client``) takes precedence over ``scheduler`` (an address); with
    neither, a LocalCluster of ``workers`` processes (default: the usable cores) is started on the
    first run and shut down by :meth:`close` (``with DaskExecutor(...) as ex``). A task is retried
    once on a transient gradebook error; a task whose worker died twice fails that student alone.

    With ``judge_server`` (default: unless ``RLHF_JUDGE_SERVER=0``) each worker process starts one
    judge server on its first task (:mod:`.judge_server`) and keeps it for the run; it is stopped on
    every worker when each run ends. ``stream`` gets a line naming the cluster.
    """

    mode = "parallel"

    def __init__(self, *, client=None, scheduler: str | None = None, workers: int | None = None,
                 stream: TextIO | None = None, judge_server: bool | None = None):
        self.client, self.scheduler, self.requested = client, scheduler, workers
        self.judge_server = judge_server
        self.workers = workers or 0
        self.stream = stream
        self._own_client = self._own_cluster = None

    def close(self) -> None:
        """Close the client and the LocalCluster this executor started (a given client stays open)."""
        client, cluster, self._own_client, self._own_cluster = self._own_client, self._own_cluster, None, None
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()

    def _connect(self):
        """The client to run on: the given one, one to ``scheduler``, or one to a LocalCluster of our own."""
        from distributed import Client

        if self.client is not None:
            return self.client
        if self._own_client is None:
            if self.scheduler:
                self._own_client = Client(self.scheduler)
            else:
                self._own_cluster = make_local_cluster(self.requested or default_workers())
                self._own_client = Client(self._own_cluster)
        return self._own_client

    def _say(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(text + "\n")
            self.stream.flush()

    # describe() says nothing: run_many() says it once the cluster is up (how many workers, where)

    def run_many(self, tasks: Sequence[tuple[TaskSpec, str]],
                 on_result: Callable[[dict], None] | None = None) -> list[dict]:
        """Every ``(spec, student)`` task (of any assignments) on the cluster, one judge server per worker."""
        from ..grader import judge_server

        serve = judge_server.enabled() if self.judge_server is None else self.judge_server
        tasks = [(dataclasses.replace(spec, judge_server=serve), s) for spec, s in tasks]
        client = self._connect()
        try:
            self.workers = len(client.scheduler_info()["workers"]) or (self.requested or 0)
            for db_url in sorted({spec.db_url for spec, _ in tasks}):
                check_sqlite_hosts(client, db_url)
            if tasks:
                names = ", ".join(dict.fromkeys(spec.assignment for spec, _ in tasks))
                self._say(f"grading {len(tasks)} student(s) of {names} on {self.workers} Dask worker(s) "
                          f"at {client.scheduler.address}")
            return run_on_dask(client, tasks, on_result)
        finally:
            if serve:
                try:
                    client.run(judge_server.stop_shared)
                except Exception as exc:  # noqa: BLE001 - a worker that is gone took its server with it
                    self._say(f"could not stop the workers' judge servers: {exc}")


class ClassExecutor(Executor):
    """A pool of ``workers`` for a whole class run (:func:`.orchestrator.grade_assignments`).

    One worker: :class:`.orchestrator.SequentialExecutor` (one judge server in this process for
    every assignment). More: one :class:`DaskExecutor` on a LocalCluster of that many processes
    (at most one per task) for the whole run, the gradebook prepared once per assignment before
    each fan-out (:func:`prepare_gradebook`). Used as a context manager: the cluster is shut down
    on leaving it.
    """

    def __init__(self, workers: int = 1):
        self.workers = max(1, int(workers))
        self.mode = "sequential" if self.workers == 1 else "parallel"
        self._dask: DaskExecutor | None = None

    def close(self) -> None:
        dask, self._dask = self._dask, None
        if dask is not None:
            dask.close()

    def describe(self, spec: TaskSpec, n: int) -> str:
        return f"grading {n} student(s) of {spec.assignment} on {self.workers} worker(s)"

    def run_many(self, tasks: Sequence[tuple[TaskSpec, str]], on_result=None) -> list:
        tasks = list(tasks)
        if self.workers == 1 or len(tasks) <= 1:
            return SequentialExecutor().run_many(tasks, on_result)
        by_assignment: dict = {}
        for spec, s in tasks:
            by_assignment.setdefault(spec.assignment, (spec, []))[1].append(s)
        for spec, who in by_assignment.values():
            prepare_gradebook(spec.course, spec.assignment, who, spec.db_url)
        if self._dask is None:
            self._dask = DaskExecutor(workers=min(self.workers, len(tasks)))
        return self._dask.run_many(tasks, on_result)
