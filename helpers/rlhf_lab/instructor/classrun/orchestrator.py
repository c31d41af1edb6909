"""One grading path: :func:`grade_submission` per (student, assignment), run by an executor of any size.

The course's sequential loop and its Dask run are the same orchestrator (otter-grader's design:
one ``grade_submission`` and a pool): :func:`grade_assignment` runs the integrity pre-flight,
hands the students it leaves to an executor, and applies the pre-flight's withheld points
afterwards. :class:`SequentialExecutor` is a pool of one; :class:`.executors.DaskExecutor` is a
pool of N. Each task is one real ``nbgrader autograde ASSIGNMENT --student ID --force`` process
in the course root (its own process group, killed on the per-student time limit), so a bad
submission fails alone, with a reason, and the others are graded; its attempt is kept in the run
records (:mod:`.records`), so a re-run grades only what did not finish.

For a class run the executors keep one judge alive for the whole run (:mod:`.judge_server`:
the sequential executor in its own process, each Dask worker once), so the hidden tests'
references compile once per run; each task's nbgrader process finds it through its environment
(``TaskSpec.judge_server``) and judges by itself when it cannot reach it.

Arguments and results are plain data (:class:`TaskSpec` in, a dict out), so a Dask worker on any
machine with the course folder can run a task.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence, TextIO

from . import records
from ..course import (COMMAND_APP, DEFAULT_STUDENT_TIMEOUT, CommandRun, Course, CourseError, account_for_course,
                      confine_if_root, is_sqlite, log_lines, nbgrader_command)

SQLITE_BUSY_TIMEOUT = 300.0  # seconds a SQLite writer waits for the lock before giving up

_TRANSIENT_PATTERNS = (
    "database is locked",
    "database table is locked",
    "could not serialize access",
    "deadlock detected",
    "server closed the connection unexpectedly",
)

#: nbgrader warnings worth a note on the student's run (not failures)
NOTE_PATTERNS = (
    ("No submitted file", "missing notebook"),
    ("Skipping unknown notebook", "unknown notebook (not part of the assignment)"),
    ("is late", "late submission"),
)


class TransientGradebookError(RuntimeError):
    """nbgrader failed on a gradebook lock/connection problem: worth one retry (the task is idempotent)."""


# ----------------------------------------------------------------------------------------- results
@dataclasses.dataclass
class StudentRun:
    """The outcome of autograding one student's assignment (picklable, JSON-friendly)."""

    student: str
    assignment: str
    ok: bool
    seconds: float
    returncode: int
    reason: str = ""  # why it failed, for the instructor ("" when ok)
    notes: list = dataclasses.field(default_factory=list)  # non-fatal problems (missing notebook, timeouts)
    log_tail: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def to_student_run(result: dict) -> StudentRun:
    """The :class:`StudentRun` of one task's result dict."""
    return StudentRun(student=result["student"], assignment=result["assignment"],
                      ok=result["status"] == "graded", seconds=round(result["seconds"], 3),
                      returncode=result["returncode"] if result["returncode"] is not None else -1,
                      reason=result["reason"], notes=list(result.get("notes") or []),
                      log_tail=result.get("log_tail") or "")


def failed_result(assignment: str, student: str, reason: str, seconds: float = 0.0) -> dict:
    """A task result for a student that was not (or could not be) graded."""
    return {"student": student, "assignment": assignment, "status": "failed", "seconds": seconds,
            "returncode": None, "reason": reason[:400], "attempt": None, "host": None, "worker_pid": None,
            "log": None, "notes": [], "log_tail": ""}


#: What the pre-flight hook (:mod:`.preflight_hook`) logs for each blocking finding and quarantine.
_PREFLIGHT_LINE = re.compile(r"integrity pre-flight: (?!not run \(quarantined\))(.+)")


def known_reason(output: str) -> str | None:
    """A plain reason for the failures nbgrader's output names (dead kernel, not JSON, ...), else None.

    When the pre-flight quarantined every notebook, nbgrader only says it found none: the reason
    is then what the pre-flight found (``<notebook> is not valid JSON ...``)."""
    if "No notebooks found" in output and "integrity pre-flight: not run (quarantined)" in output:
        found = list(dict.fromkeys(m.group(1).strip() for m in _PREFLIGHT_LINE.finditer(output)))
        if found:
            return "nothing left to grade after the integrity pre-flight: " + "; ".join(found)
    for needle, why in (
        ("UnresponsiveKernelError", "the kernel became unresponsive and could not be interrupted"),
        ("DeadKernelError", "the kernel died while running the submission (os._exit, crash or out of memory)"),
        ("Kernel died", "the kernel died while running the submission (os._exit, crash or out of memory)"),
        ("NotJSONError", "a notebook is not valid JSON"),
        ("does not appear to be JSON", "a notebook is not valid JSON"),
        ("No notebooks found", "no notebook of the assignment was found in the submission"),
        ("No kernel", "the notebook asks for a kernel that does not exist"),
        ("NoSuchKernel", "the notebook asks for a kernel that does not exist"),
        ("SchemaTooOldError", "the notebook's nbgrader metadata is from an old nbgrader"),
        ("SchemaTooNewError", "the notebook's nbgrader metadata is from a newer nbgrader"),
    ):
        if needle in output:
            return why
    return None


def command_reason(run: CommandRun) -> str:
    """Why an nbgrader command failed, in one line."""
    if run.timed_out:
        return f"autograde did not finish within {run.seconds:.0f} s; the process group was killed"
    why = known_reason(run.output)
    if why:
        return why
    errors = [e for e in run.errors() if not e.startswith("Please see")]
    if errors:
        return errors[0][:500]
    return f"nbgrader exited with code {run.returncode}"


def failure_reason(output: str, returncode: int | None) -> str:
    """A one-line reason for a failed autograde, from nbgrader's output and exit code."""
    run = CommandRun([], returncode if returncode is not None else -1, 0.0, output)
    reason = command_reason(run)
    if not reason.startswith("nbgrader exited with code"):
        return reason
    tail = [ln.strip() for ln in output.splitlines() if ln.strip()]
    exception = next((ln for ln in reversed(tail) if ":" in ln and ln.split(":")[0].endswith(
        ("Error", "Exception", "Exit", "Interrupt", "Died"))), "")
    text = exception or (tail[-1] if tail else "no output")
    return (f"nbgrader exit {returncode}: {text}" if returncode is not None else text)[:400]


def cell_timeouts(path: Path) -> list[str]:
    """Cells of the autograded notebooks in ``path`` that the per-cell timeout stopped."""
    import nbformat

    notes = []
    for nb_path in sorted(Path(path).glob("*.ipynb")):
        try:
            nb = nbformat.read(nb_path, as_version=4)
        except Exception:  # noqa: BLE001
            continue
        for i, cell in enumerate(nb.cells):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error" and out.get("ename") == "CellTimeoutError":
                    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", f"cell {i}")
                    notes.append(f"{nb_path.stem}/{gid}: stopped by the per-cell timeout")
    return notes


def run_notes(output: str, course: Course, assignment: str, student: str, ok: bool) -> list[str]:
    """Non-fatal problems of one run (missing or unknown notebook, late, cells stopped by the timeout)."""
    notes = [f"{why}: {w}" for w in log_lines(output, "WARNING") for needle, why in NOTE_PATTERNS if needle in w]
    if ok:
        notes.extend(cell_timeouts(course.autograded(student, assignment)))
    return notes


# -------------------------------------------------------------------------------------- the task
@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Everything a worker needs to grade one student (picklable, no open handles)."""

    course: Course
    assignment: str
    db_url: str  # the URL the task gives nbgrader (SQLite with a busy timeout, see worker_db_url)
    timeout: float = DEFAULT_STUDENT_TIMEOUT
    force: bool = True  # --force: a half-finished earlier attempt is wiped, the student regraded
    judge_server: bool = False  # point nbgrader at this process's judge server (started on first use)


def worker_db_url(db_url: str, busy_timeout: float = SQLITE_BUSY_TIMEOUT) -> str:
    """The URL tasks pass to nbgrader: SQLite gets a busy timeout (seconds) unless one is set."""
    import urllib.parse

    if not is_sqlite(db_url):
        return db_url
    parts = urllib.parse.urlsplit(db_url)
    if "timeout" in urllib.parse.parse_qs(parts.query):
        return db_url
    return f"{db_url}{'&' if parts.query else '?'}timeout={busy_timeout:g}"


def make_spec(course: Course, assignment: str, timeout: float | None = None, force: bool = True) -> TaskSpec:
    return TaskSpec(course, assignment, worker_db_url(course.db_url),
                    DEFAULT_STUDENT_TIMEOUT if timeout is None else timeout, force)


def _pdeathsig_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL --`` on Linux (the child dies with its worker), else nothing."""
    if sys.platform.startswith("linux"):
        setpriv = shutil.which("setpriv")
        if setpriv:
            return [setpriv, "--pdeathsig", "KILL", "--"]
    return []


def autograde_command(assignment: str, student: str, db_url: str, force: bool = True) -> list[str]:
    """The real per-student autograde command line."""
    student_arg = glob.escape(student) if glob.has_magic(student) else student
    return nbgrader_command() + ["autograde", assignment, f"--student={student_arg}"] + \
        (["--force"] if force else []) + [f"--CourseDirectory.db_url={db_url}"]


def grade_submission(spec: TaskSpec, student: str) -> dict:
    """Autograde one student's assignment with its own ``nbgrader autograde`` process; a result dict.

    Result keys: ``student, assignment, status ('graded'|'failed'), seconds, returncode, reason,
    attempt, host, worker_pid, log, notes, log_tail``. Never raises for a bad submission. Raises
    :class:`TransientGradebookError` when nbgrader failed on a gradebook lock or connection problem
    (the executor retries once; the task is idempotent).

    [trust] The run record says ``running`` while nbgrader runs and ``done`` only after it exits
    with every notebook written: a run killed in the middle leaves ``running`` and the next run
    grades this student again.
    """
    course, assignment = spec.course, spec.assignment
    started = time.time()
    record = records.begin_record(course, assignment, student, spec.db_url)
    log_file = records.log_path(course, assignment, student)
    cmd = _pdeathsig_prefix() + autograde_command(assignment, student, spec.db_url, spec.force)
    extra_env = None
    if spec.judge_server:
        from ..grader import judge_server

        extra_env = judge_server.child_env()
    returncode: int | None = None
    timed_out = False
    account, refusal = account_for_course(course.root, spec.db_url)
    shown = cmd
    if account is None and not refusal:
        cmd, refusal = confine_if_root(cmd, course.root, spec.db_url)
    env, as_account = course.env(spec.db_url, extra_env), {}
    if account is not None:
        env, as_account = account.env(env), account.popen_kwargs()
        if extra_env:
            from ..grader import judge_server

            judge_server.grant_shared(account.uid)
    with open(log_file, "w", encoding="utf-8", errors="replace") as log:
        log.write("$ " + " ".join(shown) + ("\n(confined: see rlhf_lab.instructor.confine)" if cmd != shown else "")
                  + "\n")
        log.flush()
        if refusal:  # nothing runs: the one line says what to chown
            log.write(f"[{COMMAND_APP} | ERROR] {refusal}\n")
    if refusal:
        records.finish_record(course, assignment, student, record, state="failed", seconds=0.0,
                              returncode=1, reason=refusal)
        return failed_result(assignment, student, refusal, time.time() - started)
    with open(log_file, "a", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(cmd, cwd=course.root, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, **as_account)
        records.note_child(course, assignment, student, record, proc.pid)
        try:
            returncode = proc.wait(timeout=spec.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            records.kill_tree(proc.pid)
            proc.wait()
        except BaseException:
            records.kill_tree(proc.pid)
            proc.wait()
            raise
    seconds = time.time() - started
    with open(log_file, encoding="utf-8", errors="replace") as fh:
        output = fh.read()
    if timed_out:
        status, reason = "failed", (f"autograde did not finish within {spec.timeout:g} s (the whole student); "
                                    "the process group was killed")
    elif returncode == 0 and records.autograded_notebooks(course, assignment, student):
        status, reason = "graded", ""
    elif returncode == 0:
        status, reason = "failed", "nbgrader wrote no autograded notebook"
    else:
        status, reason = "failed", failure_reason(output, returncode)
    if status == "failed" and not timed_out and any(p in output for p in _TRANSIENT_PATTERNS):
        # state stays 'running': keeps the attempt count for the retry
        records.finish_record(course, assignment, student, record, state="running", seconds=seconds,
                              returncode=returncode, reason="transient gradebook error: " + reason)
        raise TransientGradebookError(f"{student}: {reason}")
    records.finish_record(course, assignment, student, record, state="done" if status == "graded" else "failed",
                          seconds=seconds, returncode=returncode, reason=reason)
    return {"student": student, "assignment": assignment, "status": status, "seconds": seconds,
            "returncode": returncode, "reason": reason, "attempt": record["attempt"],
            "host": record["host"], "worker_pid": os.getpid(), "log": log_file,
            "notes": run_notes(output, course, assignment, student, status == "graded"),
            "log_tail": "\n".join(output.splitlines()[-40:])}


def grade_with_one_retry(spec: TaskSpec, student: str) -> dict:
    """:func:`grade_submission`, retried once on a transient gradebook error, then a failed result."""
    t0 = time.monotonic()
    try:
        try:
            return grade_submission(spec, student)
        except TransientGradebookError:
            return grade_submission(spec, student)
    except TransientGradebookError as exc:
        return failed_result(spec.assignment, student, f"gradebook error after one retry: {exc}",
                             time.monotonic() - t0)


# ------------------------------------------------------------------------------------- executors
class Executor:
    """What every pool offers: ``run_many(tasks, on_result)`` of ``(spec, student)`` tasks, ``run`` of
    one assignment's students, ``describe`` (a line for the person, may be empty), and ``close``
    (also on leaving ``with``) for what the pool started. ``workers`` and ``mode`` say what it is."""

    workers = 1
    mode = "sequential"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        """Release what the pool started (nothing here)."""

    def describe(self, spec: TaskSpec, n: int) -> str:
        return ""

    def run(self, spec: TaskSpec, students: Sequence[str],
            on_result: Callable[[dict], None] | None = None) -> list[dict]:
        """The students of one assignment: :meth:`run_many` of ``(spec, student)`` each."""
        return self.run_many([(spec, student) for student in students], on_result)

    def run_many(self, tasks: Sequence[tuple[TaskSpec, str]],
                 on_result: Callable[[dict], None] | None = None) -> list[dict]:
        raise NotImplementedError


class SequentialExecutor(Executor):
    """A pool of one: the students one after another in this process's children.

    With ``judge_server`` (default: unless ``RLHF_JUDGE_SERVER=0``) one judge server runs in this
    process for the whole :meth:`run` (or :meth:`run_many`) and every student's nbgrader process
    judges there."""

    def __init__(self, judge_server: bool | None = None):
        self.judge_server = judge_server

    def describe(self, spec: TaskSpec, n: int) -> str:
        return f"grading {n} student(s) of {spec.assignment} sequentially"

    def run_many(self, tasks: Sequence[tuple[TaskSpec, str]],
                 on_result: Callable[[dict], None] | None = None) -> list[dict]:
        """Every ``(spec, student)`` task in order (of any assignments), one judge server for them all."""
        from ..grader import judge_server

        serve = judge_server.enabled() if self.judge_server is None else self.judge_server
        results = []
        try:
            for spec, student in tasks:
                result = grade_with_one_retry(dataclasses.replace(spec, judge_server=serve), student)
                results.append(result)
                if on_result is not None:
                    on_result(result)
        finally:
            if serve:
                judge_server.stop_shared()
        return results


# ------------------------------------------------------------------------------- one assignment
def ensure_release(course: Course, assignment: str) -> None:
    """Make sure ``release/<assignment>/`` exists (the integrity pre-flight compares against it).

    A course graded from ``source/`` alone gets the release nbgrader would hand out, generated
    with a throwaway gradebook so the real one is not touched."""
    release = Path(course.root) / "release" / assignment
    if release.is_dir():
        return
    with tempfile.TemporaryDirectory(prefix="rlhf-release-db-") as scratch:
        db = "sqlite:///" + os.path.join(scratch, "gradebook.db")
        run = course.run_nbgrader(["generate_assignment", assignment, "--force", f"--CourseDirectory.db_url={db}"],
                                  db_url=db)
    if not run.ok or not release.is_dir():
        raise CourseError(f"release/{assignment} is missing and generating it from {course.source_directory}/ "
                          f"failed:\n{run.output[-4000:]}")


def ensure_compile_cache(course: Course, assignments: Iterable[str], stream: TextIO | None = None) -> None:
    """Build or reuse each assignment's trusted JAX compilation cache seed (see :mod:`.compile_cache`)."""
    from ..grader import compile_cache as cc

    for assignment in assignments:
        seed = cc.ensure_seed(course.root, assignment)
        if stream is None:
            continue
        if seed.problem:
            stream.write(f"compile cache: none ({seed.problem}); kernels compile from scratch\n")
        elif seed.rebuilt:
            stream.write(f"compile cache: seed built from the source notebooks in {seed.seconds:.0f} s "
                         f"({seed.entries} programs)\n")


@dataclasses.dataclass
class AssignmentRun:
    """What :func:`grade_assignment` did: one result per student it was given, and the pre-flight."""

    results: list  # [dict] (see grade_submission)
    report: object = None  # integrity.IntegrityReport, or None without the pre-flight


def grade_assignment(course: Course, assignment: str, students: Sequence[str], executor=None, *,
                     timeout: float | None = None, preflight: bool = True, report_blocked: bool = True,
                     stream: TextIO | None = None, select: Callable[[list], list] | None = None,
                     on_result: Callable[[dict], None] | None = None) -> AssignmentRun:
    """Pre-flight -> ``executor`` runs :func:`grade_submission` per student -> withheld points.

    ``executor`` defaults to :class:`SequentialExecutor`. With ``preflight`` the integrity checks run
    first (:func:`.integrity.preflight`: malformed or hostile files quarantined); students it finds
    ungradable are not run, and come back as failed results naming the problem when
    ``report_blocked``. ``select(students)``, when given, picks which of the remaining students
    run (for example those whose last run did not finish). After grading, the points of blocked
    cells are withheld (:func:`.integrity.apply_overrides`).
    """
    from ..grader import integrity

    executor = executor or SequentialExecutor()
    spec = make_spec(course, assignment, timeout)
    todo = list(students)
    results: list[dict] = []
    report = None
    if preflight and todo:
        ensure_release(course, assignment)
        report = integrity.preflight(assignment, course, todo)
        blocked = set(report.ungradable())
        if report_blocked:
            for student in sorted(blocked & set(todo)):
                why = "; ".join(f.message for f in report.for_student(student)) or "cannot be graded"
                results.append(failed_result(assignment, student, f"integrity pre-flight: {why}"))
                if on_result is not None:
                    on_result(results[-1])
        todo = [s for s in todo if s not in blocked]
        if stream is not None and report.findings:
            stream.write(f"integrity pre-flight: {len(report.findings)} finding(s) in {len(students)} "
                         f"submission(s); details in integrity/{assignment}.json\n")
    if select is not None:
        todo = list(select(todo))
    if todo:
        said = executor.describe(spec, len(todo))
        if stream is not None and said:
            stream.write(said + "\n")
            stream.flush()
        results += executor.run(spec, todo, on_result)
    if report is not None:
        integrity.apply_overrides(report, course)
    return AssignmentRun(results, report)


def grade_assignments(course: Course, students: dict, executor=None, *, timeout: float | None = None,
                      preflight: bool = True, report_blocked: bool = True,
                      select: Callable[[str, list], list] | None = None,
                      on_result: Callable[[dict], None] | None = None,
                      on_preflight: Callable[[str, object], None] | None = None,
                      order: Callable[[list], list] | None = None) -> dict:
    """:func:`grade_assignment` for several assignments as ONE executor run: ``{assignment: AssignmentRun}``.

    ``students`` is ``{assignment: [student, ...]}``. Every assignment's pre-flight runs first (as in
    :func:`grade_assignment`; ``on_preflight(assignment, report)`` after each), then every
    remaining ``(spec, student)`` task goes to ``executor.run_many`` at once, so a pool of N stays
    busy across assignments instead of waiting at the end of each one for its last student;
    ``order(tasks)`` may reorder the task list (for example the costliest first). Then each
    assignment's withheld points are applied. The tasks, their records and their results are those
    of :func:`grade_assignment`; ``executor`` defaults to :class:`SequentialExecutor`.
    """
    from ..grader import integrity

    executor = executor or SequentialExecutor()
    out: dict = {}
    tasks: list = []
    for assignment, who in students.items():
        spec = make_spec(course, assignment, timeout)
        todo = list(who)
        run = out[assignment] = AssignmentRun([], None)
        if preflight and todo:
            ensure_release(course, assignment)
            run.report = integrity.preflight(assignment, course, todo)
            blocked = set(run.report.ungradable())
            if report_blocked:
                for student in sorted(blocked & set(todo)):
                    why = "; ".join(f.message for f in run.report.for_student(student)) or "cannot be graded"
                    run.results.append(failed_result(assignment, student, f"integrity pre-flight: {why}"))
                    if on_result is not None:
                        on_result(run.results[-1])
            todo = [s for s in todo if s not in blocked]
        if on_preflight is not None:
            on_preflight(assignment, run.report)
        if select is not None:
            todo = list(select(assignment, todo))
        tasks += [(spec, s) for s in todo]
    if order is not None:
        tasks = list(order(tasks))
    if tasks:
        for result in executor.run_many(tasks, on_result):
            out[result["assignment"]].results.append(result)
    for run in out.values():
        if run.report is not None:
            integrity.apply_overrides(run.report, course)
    return out
