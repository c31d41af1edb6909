"""The instructor pipeline: generate -> collect -> autograde -> feedback -> export, on real nbgrader.

Every step runs the real nbgrader command line (:func:`nbgrader_command`) in a subprocess whose
working directory is the course root and whose ``PATH`` starts with this interpreter's ``bin``
(nbgrader shells out to the bare ``alembic`` command when it creates a gradebook). The course root
and the gradebook URL reach ``nbgrader_config.py`` through ``RLHF_COURSE_ROOT`` and
``RLHF_COURSE_DB``, so the same functions run on the repository or on a copy of it.

Each student is autograded in its own ``nbgrader autograde ASSIGNMENT --student ID`` process (its
own process group, killed as a whole on the per-student time limit), so a bad submission fails
alone and is recorded with a reason while the rest of the class is graded.

Layers: :mod:`.course` (the :class:`~.course.Course` object: root, gradebook, nbgrader's layout
and command) < :mod:`.records` (which runs finished: resume) < :mod:`.integrity` (the pre-flight
of the submitted files) < :mod:`.orchestrator` (the one grading path: ``grade_submission`` per
student, run by an executor of any size; the sequential executor) < :mod:`.executors` (the Dask
executor and the class pool) < this module (the course command, the one :class:`ClassRun` and
its tables) < :mod:`.parallel` (the command line of one assignment's fan-out).
:func:`run_class` builds the course object once and passes it down; the functions below also
accept a root for callers that only have one (``root=None`` -> :func:`course_root`, and
``db_url=None`` -> the config's default, SQLite ``<root>/gradebook.db``):

=========================  ===================================================================
``generate()``             ``nbgrader generate_assignment A --force`` for every assignment
``validate(paths)``        ``nbgrader validate`` -> :class:`ValidateResult` per notebook
``collect(subs_dir)``      copy ``<subs>/<student>/<assignment>/`` into ``submitted/``
``autograde(a, student)``  one process per student -> list of :class:`StudentRun`
``autograde_student``      one student, picklable arguments and result (for a Dask worker)
``feedback(a)``            ``nbgrader generate_feedback`` -> HTML per student
``export_csv(path)``       ``nbgrader export`` -> CSV, one row per student and graded assignment
``read_grades()``          the gradebook as :class:`Grades` (per assignment and per test cell)
``format_tables(grades)``  the two text tables printed by ``make demo``
``format_runs(run)``       the per-student table of a run (status, score, time, try, reason)
``copy_course(dest)``      the course (config, source, release, examples, seeds) copied, no outputs
``run_class(subs_dir)``    all of the above in order -> :class:`ClassRun` (+ JSON report)
=========================  ===================================================================
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Iterable, Sequence

from . import records
from ..course import (  # noqa: F401  (re-exported: the pipeline's names since the start)
    COURSE_ID, DEFAULT_STUDENT_TIMEOUT, REPO_ROOT, CommandRun, Course, PipelineError, as_course, assignments,
    check_config, course_root, db_identity, default_db_url, ensure_venv_on_path, graded_assignments,
    is_grade_cell, nbgrader_command, nbgrader_env, notebooks, run_nbgrader, submitted_students, venv_bin,
)
from ..course import kill_group as _kill_group  # noqa: F401
from ..course import log_lines as _log_lines  # noqa: F401
from .orchestrator import (  # noqa: F401
    Executor, SequentialExecutor, StudentRun, grade_assignment, grade_assignments, grade_with_one_retry,
    make_spec, to_student_run,
)
from .orchestrator import NOTE_PATTERNS as _NOTE_PATTERNS  # noqa: F401
from .orchestrator import cell_timeouts as _cell_timeouts  # noqa: F401
from .orchestrator import command_reason as _reason  # noqa: F401
from .executors import ClassExecutor, default_workers  # noqa: F401  (the class pool; the cores usable here)
from .progress import fmt_seconds

REPORT_NAME = "grading_report.json"
#: Outputs of the pipeline inside the course root (all gitignored; ``autograded/.gitkeep`` stays).
OUTPUTS = ("submitted", "autograded", "feedback", "gradebook.db", "grades.csv", REPORT_NAME,
           "integrity",  # [trust] integrity/<assignment>.json and integrity/quarantine/
           records.RUNS_DIRNAME)  # [trust] one run record per student and assignment (resume)


# ---------------------------------------------------------------------------------------- generate
def generate(root=None, names: Iterable[str] | None = None, db_url: str | None = None) -> list[CommandRun]:
    """``nbgrader generate_assignment NAME --force`` for each assignment (release/ + gradebook rows).

    Raises :class:`PipelineError` naming the assignment if nbgrader fails (for example a hidden
    test outside a grade cell, or duplicate grade ids).
    """
    runs = []
    for name in (list(names) if names is not None else assignments(root)):
        run = run_nbgrader(["generate_assignment", name, "--force"], root, db_url)
        if not run.ok:
            raise PipelineError(f"generate_assignment {name} failed:\n" + "\n".join(run.errors() or [run.output[-3000:]]))
        runs.append(run)
    return runs


@dataclasses.dataclass
class ValidateResult:
    """What ``nbgrader validate`` said about one notebook."""

    path: str
    passed: bool
    failed_cells: int
    output: str


def validate(paths: Iterable[str | os.PathLike], root=None, invert: bool = False) -> list[ValidateResult]:
    """Run ``nbgrader validate`` on the notebooks (one process for all) and parse each verdict."""
    paths = [Path(p).resolve() for p in paths]
    if not paths:
        return []
    run = run_nbgrader(["validate", *map(str, paths)] + (["--invert"] if invert else []), root)
    # nbgrader logs "Validating '<path>'" before each notebook: split the output there.
    marks = [(m.start(), Path(m.group(1))) for m in re.finditer(r"Validating '([^']+)'", run.output)]
    chunks = {}
    for i, (pos, path) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else len(run.output)
        chunks[path.resolve()] = run.output[pos:end]
    out = []
    for path in paths:
        text = chunks.get(path)
        if text is None:  # nbgrader stopped before this notebook
            out.append(ValidateResult(str(path), False, -1, run.output))
            continue
        if invert:
            m = re.search(r"NOTEBOOK PASSED ON (\d+) CELL", text)
            passed = m is None and "Success! The notebook does not pass any tests." in text
        else:
            m = re.search(r"VALIDATION FAILED ON (\d+) CELL", text)
            passed = m is None and "Success! Your notebook passes all the tests." in text
        failed = int(m.group(1)) if m else (0 if passed else -1)
        out.append(ValidateResult(str(path), passed, failed, text))
    return out


# ----------------------------------------------------------------------------------------- collect
@dataclasses.dataclass
class CollectResult:
    """Which (student, assignment) pairs were copied into ``submitted/`` and what was skipped."""

    collected: list  # [(student, assignment)]
    problems: dict  # {(student, assignment or ""): reason}


def collect(submissions_dir: str | os.PathLike, root=None, names: Iterable[str] | None = None,
            students: Iterable[str] | None = None, clean: bool = True) -> CollectResult:
    """Copy ``<submissions_dir>/<student>/<assignment>/`` into ``<root>/submitted/<student>/<assignment>/``.

    This is nbgrader's ``submitted/`` layout, filled from a plain folder (the bundled examples, an
    LMS download unpacked by student) instead of nbgrader's exchange. Only known assignments are
    copied; anything else is reported in ``problems``. ``clean`` replaces an earlier copy.

    Nothing is followed (:func:`.safe_files.copy_tree_safely`): links and FIFOs are made again as
    what they are (a link with the same text, a new FIFO) so the integrity pre-flight reports and
    moves them; sockets, devices, hard links and files over the size limit are not copied and are
    reported in ``problems``; a student or assignment folder that is a link, or a submission over
    the total limit, is not collected (also in ``problems``). The other students are collected.
    """
    root = course_root(root)
    subs = Path(submissions_dir)
    known = set(names) if names is not None else set(assignments(root))
    wanted = set(students) if students is not None else None
    collected, problems = [], {}
    for student_dir in sorted(p for p in subs.iterdir() if p.is_dir()):
        student = student_dir.name
        if wanted is not None and student not in wanted:
            continue
        if student_dir.is_symlink():
            problems[(student, "")] = (f"student {student!r}: the folder {student_dir} is a symbolic link; it "
                                       "was not followed or collected: hand in a plain folder")
            continue
        for adir in sorted(p for p in student_dir.iterdir()):
            if adir.is_symlink():
                problems[(student, adir.name)] = (f"student {student!r}: {adir} is a symbolic link, not a folder; "
                                                  "it was not followed or collected: hand in a plain folder")
                continue
            if not adir.is_dir():
                problems[(student, "")] = f"unexpected file {adir.name!r} beside the assignment folders"
                continue
            if adir.name not in known:
                problems[(student, adir.name)] = f"unknown assignment folder {adir.name!r}"
                continue
            dest = root / "submitted" / student / adir.name
            if os.path.lexists(dest) and clean:
                shutil.rmtree(dest) if dest.is_dir() and not dest.is_symlink() else dest.unlink()
            refused: list = []
            try:
                _collect_one(adir, dest, refused)
            except OSError as exc:  # safe_files.UnsafeFileError included: the student alone is not collected
                why = dataclasses.replace(exc.refusal, student=student).message if hasattr(exc, "refusal") else exc
                problems[(student, adir.name)] = f"not collected: {why}"
                continue
            if refused:  # a plain folder of submissions: the student is the folder, not read from the path
                problems[(student, adir.name)] = "; ".join(dataclasses.replace(r, student=student).message
                                                           for r in refused)
            collected.append((student, adir.name))
    return CollectResult(collected, problems)


def _collect_one(adir: Path, dest: Path, refused: list) -> None:
    """Copy one submission folder into ``dest`` (merged into an existing copy when ``clean`` was off)."""
    from ..grader import safe_files

    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")
    if not os.path.lexists(dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        safe_files.copy_tree_safely(adir, dest, keep_special=True, refused=refused, ignore=ignore)
        return
    staging = dest.with_name(f".{dest.name}.collect-{os.getpid()}")
    if os.path.lexists(staging):
        shutil.rmtree(staging)
    safe_files.copy_tree_safely(adir, staging, keep_special=True, refused=refused, ignore=ignore)
    try:  # staging is this process's own fresh copy: plain os.walk (never into a link) is enough
        for dirpath, dirnames, filenames in os.walk(staging, followlinks=False):
            for name in dirnames + filenames:
                src = Path(dirpath) / name
                target = dest / src.relative_to(staging)
                if src.is_dir() and not src.is_symlink():
                    if os.path.lexists(target) and (target.is_symlink() or not target.is_dir()):
                        target.unlink()
                    target.mkdir(exist_ok=True)
                else:
                    if os.path.lexists(target):
                        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
                    os.rename(src, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def already_submitted(root=None, names: Iterable[str] | None = None,
                      students: Iterable[str] | None = None) -> CollectResult:
    """What is in ``submitted/`` now (put there by ``nbgrader collect`` or ``zip_collect``), as a
    :class:`CollectResult` of the known assignments (and ``students``, when given)."""
    root = course_root(root)
    known = list(names) if names is not None else assignments(root)
    wanted = set(students) if students is not None else None
    pairs = [(sid, a) for a in known for sid in submitted_students(a, root) if wanted is None or sid in wanted]
    return CollectResult(sorted(pairs), {})


# --------------------------------------------------------------------------------------- autograde
def autograde_student(assignment: str, student: str, root=None, db_url: str | None = None,
                      force: bool = True, timeout: float | None = None, course=None) -> StudentRun:
    """Autograde one student's assignment with its own ``nbgrader autograde`` process.

    The course's one task (:func:`.orchestrator.grade_submission`, retried once on a transient
    gradebook error). Never raises for a bad submission: failures come back as ``ok=False`` with a
    ``reason``. ``course`` (a :class:`~.course.Course`) is read from the config when not given.
    """
    course = course if course is not None else as_course(root, db_url)
    spec = make_spec(course, assignment, timeout, force)
    return to_student_run(grade_with_one_retry(spec, student))


def autograde(assignment: str, student: str | Iterable[str] | None = None, root=None,
              db_url: str | None = None, force: bool = True, timeout: float | None = None,
              progress=None, course=None) -> list[StudentRun]:
    """Autograde ``assignment`` for one student, several, or everyone in ``submitted/``, one process each.

    The sequential executor (a pool of one) of :mod:`.orchestrator`, without the pre-flight
    (:func:`run_class` runs it). ``progress(run)`` is called after each student (for printing).
    Failures are returned, not raised.
    """
    course = course if course is not None else as_course(root, db_url)  # read once
    if student is None:
        students = course.submitted_students(assignment)
    elif isinstance(student, str):
        students = [student]
    else:
        students = list(student)
    spec = make_spec(course, assignment, timeout, force)
    on_result = (lambda result: progress(to_student_run(result))) if progress is not None else None
    return [to_student_run(r) for r in SequentialExecutor().run(spec, students, on_result)]


def pending(assignment: str, root=None, db_url: str | None = None, course=None) -> list[str]:
    """Submitted students whose last autograde of this submission into this gradebook did not finish.

    [trust] Finished means (:func:`.records.is_completed`): the student's run record
    (``.autograde_runs/<assignment>/``) says ``done`` for this gradebook and for exactly the
    submitted files, the autograded notebooks exist and the gradebook has the submission. Files in
    ``autograded/`` alone prove nothing: nbgrader writes each notebook there before running it, so
    a run killed in the middle of a notebook leaves it with empty grades.
    """
    course = course if course is not None else as_course(root, db_url)
    return records.pending(course, assignment)


# ---------------------------------------------------------------------------------------- feedback
def feedback(assignment: str, root=None, db_url: str | None = None,
             students: Iterable[str] | None = None, release_pending: bool = False,
             leaks: dict | None = None) -> dict:
    """``nbgrader generate_feedback`` for ``assignment``; returns ``{student: [html paths]}``.

    One call for the whole assignment; if it fails, each student is retried alone so one broken
    autograded notebook cannot cost the others their feedback.

    Feedback for a notebook with an answer still waiting for a human grader is **held back**:
    its HTML is removed again, so ``nbgrader release_feedback`` cannot hand it out, and
    :func:`held_feedback` lists it. ``release_pending=True`` keeps it; such a page then says
    "awaiting grading" for those answers instead of a score of 0 (``feedback_filter.MarkPendingGrades``).

    [trust] Every page written is then checked for hidden-test and ``source/`` text
    (:func:`check_written_feedback`); a page that leaks is removed, so it cannot be released, and
    ``leaks`` (when given) gets ``{path relative to the root: [leaked lines]}``.
    """
    if not isinstance(release_pending, bool):
        raise TypeError(f"release_pending must be True or False, got {release_pending!r}")
    root = course_root(root)
    run = run_nbgrader(["generate_feedback", assignment, "--force"], root, db_url)
    if not run.ok:
        for sid in (students if students is not None else _autograded_students(assignment, root)):
            run_nbgrader(["generate_feedback", assignment, "--student", sid, "--force"], root, db_url)
    return _finish_feedback(assignment, root, db_url, release_pending, leaks)


def _finish_feedback(assignment: str, root: Path, db_url: str | None, release_pending: bool,
                     leaks: dict | None) -> dict:
    """After ``generate_feedback``: hold back pages awaiting hand grading, remove pages that leak."""
    if not release_pending:
        for sid, nbs in held_feedback(assignment, root, db_url).items():
            for nb in nbs:
                path = root / "feedback" / sid / assignment / f"{nb}.html"
                if os.path.lexists(path):  # a link is removed itself, never its target
                    path.unlink()
    found = check_written_feedback(assignment, root)
    if leaks is not None:
        leaks.update(found)
    return feedback_files(assignment, root)


def check_written_feedback(assignment: str, root=None, remove: bool = True) -> dict:
    """The hidden-text check on every feedback page of ``assignment``; removes the pages that leak.

    Returns ``{page path relative to the root: [leaked lines]}`` (empty: every page is clean).
    Hidden-test lines count when they are a whole line of the page's code or appear in an output;
    lines of the instructor's answers only when they appear in an output (a student's own answer
    may equal the instructor's): see :func:`.feedback_filter.leaked_lines`.
    """
    from ..grader import feedback_filter

    root = course_root(root)
    pages = sorted((root / "feedback").glob(f"*/{assignment}/*.html"))
    if not pages:
        return {}
    secrets = feedback_filter.hidden_lines(root / "source")
    answers = feedback_filter.source_only_lines(root / "source", root / "release")
    out = {}
    for page in pages:
        try:
            found = feedback_filter.leaked_lines(page, secrets, answers)
        except OSError as exc:  # a link, a FIFO, a hard link, too large: never read, never released
            found = [f"[not checked, not released: {exc}]"]
        if found:
            out[str(page.relative_to(root))] = found
            if remove:
                page.unlink()
    return out


def held_feedback(assignment: str, root=None, db_url: str | None = None) -> dict:
    """``{student: [notebook]}``: notebooks of ``assignment`` whose feedback waits for hand grading.

    A notebook waits while any of its cells is flagged for manual grading without a manual
    score (read from the gradebook; an integrity override counts as graded).
    """
    from nbgrader.api import Gradebook, MissingEntry

    ensure_venv_on_path()
    out = {}
    with Gradebook(db_url or default_db_url(root), COURSE_ID) as gb:
        try:
            subs = gb.find_assignment(assignment).submissions
        except MissingEntry:
            return out
        for sub in subs:
            waiting = sorted(nb.name for nb in sub.notebooks
                             if any(g.needs_manual_grade and g.manual_score is None for g in nb.grades))
            if waiting:
                out[sub.student.id] = waiting
    return out


def feedback_class(names: Iterable[str], root=None, db_url: str | None = None, workers: int = 1,
                   release_pending: bool = False, leaks: dict | None = None, reporter=None) -> dict:
    """:func:`feedback` for every assignment of ``names``, ``workers`` nbgrader processes at a time.

    ``{assignment: {student: [html paths]}}``. With one worker, one ``generate_feedback`` per
    assignment, as :func:`feedback`. With more, each assignment's autograded students are dealt
    into ``workers`` groups and each group is one ``generate_feedback A --force`` that leaves the
    other groups out (``--CourseDirectory.student_id_exclude``; only when no student id holds a
    comma, else the assignment is one process); the processes only read the gradebook and each
    writes its own students' folders. A group that fails is retried student by student. Then, per
    assignment, the held-back pages and the hidden-text check of :func:`feedback`. ``reporter``
    (:class:`.progress.Reporter`) shows the pages written as they appear.
    """
    from concurrent.futures import ThreadPoolExecutor

    from . import progress

    if not isinstance(release_pending, bool):
        raise TypeError(f"release_pending must be True or False, got {release_pending!r}")
    rep = reporter or progress.null_reporter()
    root = course_root(root)
    names = list(names)
    workers = max(1, int(workers or 1))
    jobs = []  # (assignment, the group or None for everyone, everyone)
    pages = 0
    for a in names:
        everyone = _autograded_students(a, root)
        pages += sum(len(list((root / "autograded" / s / a).glob("*.ipynb"))) for s in everyone)
        n = min(workers, len(everyone)) if not any("," in s for s in everyone) else 1
        if n <= 1:
            jobs.append((a, None, everyone))
        else:
            jobs += [(a, everyone[i::n], everyone) for i in range(n)]
    jobs.sort(key=lambda job: -len(job[1] if job[1] is not None else job[2]))

    def one(job) -> None:
        a, group, everyone = job
        args = ["generate_feedback", a, "--force"]
        if group is not None:
            others = [s for s in everyone if s not in set(group)]
            args.append("--CourseDirectory.student_id_exclude=" + ",".join(others))
        run = run_nbgrader(args, root, db_url)
        if not run.ok:
            for sid in (group if group is not None else everyone):
                run_nbgrader(["generate_feedback", a, "--student", sid, "--force"], root, db_url)

    started = time.time()

    def written() -> int:
        count = 0
        for a in names:
            for page in (root / "feedback").glob(f"*/{a}/*.html"):
                try:
                    count += page.stat().st_mtime >= started - 1
                except OSError:
                    continue
        return count

    with rep.phase("feedback", pages, unit="notebook", workers=workers, poll=written,
                   estimate=estimate_seconds("feedback", pages, workers),
                   what="nbgrader generate_feedback, HTML per notebook"):
        with ThreadPoolExecutor(max_workers=min(workers, max(1, len(jobs)))) as pool:
            list(pool.map(one, jobs))
    return {a: _finish_feedback(a, root, db_url, release_pending, leaks) for a in names}


def _autograded_students(assignment: str, root) -> list[str]:
    auto = course_root(root) / "autograded"
    return sorted(p.name for p in auto.iterdir() if (p / assignment).is_dir()) if auto.is_dir() else []


def feedback_files(assignment: str, root=None) -> dict:
    """``{student: [feedback/<student>/<assignment>/*.html]}`` as they exist now."""
    fb = course_root(root) / "feedback"
    out = {}
    if fb.is_dir():
        for sdir in sorted(p for p in fb.iterdir() if p.is_dir()):
            files = sorted((sdir / assignment).glob("*.html"))
            if files:
                out[sdir.name] = files
    return out


# ------------------------------------------------------------------------------------------ export
def export_csv(path: str | os.PathLike | None = None, root=None, db_url: str | None = None,
               names: Iterable[str] | None = None) -> Path:
    """``nbgrader export`` to ``path`` (default ``<root>/grades.csv``): one row per student and graded
    assignment, with the hand-graded points still pending and the roster's ``lms_user_id``
    (:mod:`rlhf_lab.instructor.operations.csv_export`)."""
    root = course_root(root)
    dest = Path(path).resolve() if path is not None else root / "grades.csv"
    args = ["export", "--to", str(dest)]
    if names is not None:
        # the base class's option: it reaches the course's plugin (csv_export.CsvExport) and nbgrader's
        args += ["--ExportPlugin.assignment=" + json.dumps(list(names))]
    run = run_nbgrader(args, root, db_url)
    if not run.ok or not dest.exists():
        raise PipelineError("nbgrader export failed:\n" + run.output[-3000:])
    return dest


# ---------------------------------------------------------------------------------------- gradebook
@dataclasses.dataclass(frozen=True)
class CellGrade:
    """One graded cell of one student's submission, as stored in the gradebook."""

    student: str
    assignment: str
    notebook: str
    grade_id: str
    kind: str  # "test" (autograder test), "answer" (autograded answer with points), "manual", "task"
    score: float | None  # None while a manual grade is pending
    max_score: float
    needs_manual_grade: bool
    auto_score: float | None = None  # what the autograder gave (None: nothing)
    manual_score: float | None = None  # what a person set (Formgrader, or the pre-flight withholding it)
    extra_credit: float = 0.0


@dataclasses.dataclass
class Grades:
    """Everything the gradebook knows, flattened: per cell and per (student, assignment)."""

    cells: list  # [CellGrade]
    totals: dict  # {(student, assignment): (score, max_score)}
    layout: dict  # {assignment: [(notebook, grade_id, kind, max_score)]} in notebook order

    def cell(self, student: str, assignment: str, grade_id: str) -> CellGrade:
        for c in self.cells:
            if (c.student, c.assignment, c.grade_id) == (student, assignment, grade_id):
                return c
        raise KeyError((student, assignment, grade_id))

    def students(self, assignment: str | None = None) -> list[str]:
        return sorted({s for (s, a) in self.totals if assignment is None or a == assignment})

    def tests(self, assignment: str) -> list[str]:
        """Grade ids of the autograder test cells of ``assignment``."""
        return [gid for (_, gid, kind, _) in self.layout.get(assignment, []) if kind == "test"]

    def by_cell(self, student: str, assignment: str) -> dict:
        return {c.grade_id: c for c in self.cells if c.student == student and c.assignment == assignment}

    def breakdown(self, student: str, assignment: str) -> tuple[float, float, float]:
        """``(auto, manual, pending)`` points of one submission, by the rule of ``grades.csv``'s
        ``auto_score``, ``manual_score`` and ``pending_manual_points`` (:mod:`.csv_export`): a cell
        counts as manual once a person (or the pre-flight, withholding it) set its manual score, else
        as auto; a cell waiting for a hand grade adds its maximum to the pending points."""
        auto = manual = pending = 0.0
        for c in self.cells:
            if c.student != student or c.assignment != assignment:
                continue
            if c.manual_score is not None:
                manual += c.manual_score + (c.extra_credit or 0.0)
            else:
                if c.auto_score is not None:
                    auto += c.auto_score + (c.extra_credit or 0.0)
                if c.needs_manual_grade:
                    pending += c.max_score
        return auto, manual, pending

    def autograded_max(self, assignment: str) -> float:
        """The points of the autograded cells (tests and autograded answers) of ``assignment``."""
        return float(sum(mx for (_, _, kind, mx) in self.layout.get(assignment, []) if kind in ("test", "answer")))


def _kind(grade_cell, solution_names: set) -> str:
    if grade_cell.name in solution_names:
        return "answer" if grade_cell.cell_type == "code" else "manual"
    return "test" if grade_cell.cell_type == "code" else "manual"


def read_grades(root=None, db_url: str | None = None) -> Grades:
    """Read every submission's per-cell grades through :class:`nbgrader.api.Gradebook`."""
    from nbgrader.api import Gradebook

    ensure_venv_on_path()
    cells, totals, layout = [], {}, {}
    with Gradebook(db_url or default_db_url(root), COURSE_ID) as gb:
        for assignment in gb.assignments:
            kinds = {}
            lay = []
            for nb in assignment.notebooks:
                solution_names = {c.name for c in nb.solution_cells}
                for gc in nb.grade_cells:
                    kinds[(nb.name, gc.name)] = _kind(gc, solution_names)
                    lay.append((nb.name, gc.name, kinds[(nb.name, gc.name)], float(gc.max_score)))
                for tc in nb.task_cells:
                    kinds[(nb.name, tc.name)] = "task"
                    lay.append((nb.name, tc.name, "task", float(tc.max_score)))
            layout[assignment.name] = lay
            for sub in assignment.submissions:
                sid = sub.student.id
                totals[(sid, assignment.name)] = (float(sub.score), float(sub.max_score))
                for snb in sub.notebooks:
                    for g in snb.grades:
                        score = None if g.needs_manual_grade and g.manual_score is None else g.score
                        cells.append(CellGrade(sid, assignment.name, snb.name, g.name,
                                               kinds.get((snb.name, g.name), "test"),
                                               None if score is None else float(score),
                                               float(g.max_score), bool(g.needs_manual_grade),
                                               None if g.auto_score is None else float(g.auto_score),
                                               None if g.manual_score is None else float(g.manual_score),
                                               float(g.extra_credit or 0.0)))
    order = {(a, nb, gid): i for a, lay in layout.items() for i, (nb, gid, _, _) in enumerate(lay)}
    cells.sort(key=lambda c: (c.assignment, c.student, order.get((c.assignment, c.notebook, c.grade_id), 0)))
    return Grades(cells, totals, layout)


def _fmt(x: float | None) -> str:
    if x is None:
        return "manual"
    return f"{x:g}"


def format_tables(grades: Grades, runs: Sequence[StudentRun] = (), reasons: dict | None = None) -> str:
    """Plain-text tables: per student and assignment (autograded points, hand-graded points set and
    pending, the total so far, and why anything went wrong), then per test cell x student.

    ``reasons`` is ``{(student, assignment): [text]}`` (:meth:`ClassRun.reasons`: what the
    pre-flight did, failed runs, notes); without it the reason is a failed run's."""
    failed = {(r.student, r.assignment): r.reason for r in runs if not r.ok}
    why = {k: list(v) for k, v in (reasons or {}).items() if v}
    if reasons is None:
        why = {k: [f"autograde failed: {r}"] for k, r in failed.items()}
    # assignments with something to grade (the widget explorer has no graded cell)
    names = sorted(a for a, lay in grades.layout.items() if lay)
    pairs = sorted(set(grades.totals) | set(failed) | set(why), key=lambda k: (k[0], k[1]))
    lines = ["Grades per student (autograded: points of the autograded cells, of their maximum; "
             "hand-graded: points a grader set, or the pre-flight withheld; pending: hand-graded "
             "points nobody has scored yet, not counted as 0; total: what the gradebook counts now)", ""]
    header = ["student", "assignment", "autograded", "hand-graded", "pending", "total", "reason"]
    rows = []
    for sid, a in pairs:
        if (sid, a) in failed:
            auto_col, hand_col, pend_col, total_col = "FAILED", "-", "-", "-"
        elif (sid, a) in grades.totals:
            auto, manual, pending = grades.breakdown(sid, a)
            s, m = grades.totals[(sid, a)]
            set_by_hand = any(c.manual_score is not None for c in grades.cells
                              if c.student == sid and c.assignment == a)
            auto_col = f"{auto:g} / {grades.autograded_max(a):g}"
            hand_col = f"{manual:g}" if set_by_hand else "-"
            pend_col = f"{pending:g}" if pending else "-"
            total_col = f"{s:g} / {m:g}"
        else:
            auto_col, hand_col, pend_col, total_col = "-", "-", "-", "-"
        rows.append([sid, a, auto_col, hand_col, pend_col, total_col, "; ".join(why.get((sid, a), []))])
    lines += table(header, rows)
    students = sorted({s for (s, _) in pairs})
    for a in names:
        lay = [x for x in grades.layout[a] if x[2] != "task"]
        subs = [s for s in students if (s, a) in grades.totals]
        if not lay or not subs:
            continue
        lines += ["", f"Per test cell: {a} (points per student; 'manual' = awaiting a human grader)", ""]
        by = {s: grades.by_cell(s, a) for s in subs}
        short = _short_names(subs)
        header = ["notebook", "grade_id", "kind", "max"] + [short[s] for s in subs]
        rows = []
        for nb, gid, kind, mx in lay:
            row = [nb, gid, kind, f"{mx:g}"]
            for s in subs:
                c = by[s].get(gid)
                row.append("-" if c is None else _fmt(c.score))
            rows.append(row)
        lines += table(header, rows)
        legend = [f"{short[s]} = {s}" for s in subs if short[s] != s]
        if legend:
            lines += ["", "columns: " + ", ".join(legend)]
    return "\n".join(lines)


def _short_names(students: Sequence[str]) -> dict:
    """Column headers: the part of each id before its first ``_`` when that is unique, else the id."""
    heads = [s.split("_", 1)[0] for s in students]
    return {s: (h if h and heads.count(h) == 1 else s) for s, h in zip(students, heads)}


def table(header: Sequence, rows: Sequence[Sequence]) -> list[str]:
    """The lines of a plain-text table: the header, a rule of dashes, one line per row.

    Every column is as wide as its longest cell, columns are two spaces apart and trailing spaces
    are dropped. The course's one table formatter: the grade tables (:func:`format_tables`) and
    the table of a run (:func:`format_runs`) are both made with it."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(str(h)) for h in header]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


def run_rows(run: "ClassRun") -> list[list[str]]:
    """Per student of a run, sorted: student, status, score / max, time, attempt, reason.

    ``run.results`` gives the graded and failed students (a student graded on a second attempt
    says so), ``run.skipped`` those graded before (their score, if the gradebook has it)."""
    rows = []
    for r in run.results:
        score = f"{r['score']:g}/{r['max_score']:g}" if r.get("score") is not None else "-"
        reason = r.get("reason") or ""
        if r["status"] == "graded" and (r.get("attempt") or 1) > 1:
            reason = f"regraded (attempt {r['attempt']}) after an interrupted attempt"
        rows.append([r["student"], r["status"], score, f"{r['seconds']:.1f}s", str(r.get("attempt") or "-"), reason])
    for student, score in run.skipped.items():
        rows.append([student, "skipped", f"{score[0]:g}/{score[1]:g}" if score else "-", "-", "-",
                     "already graded (use --force to regrade)"])
    return sorted(rows, key=lambda row: row[0])


def run_summary(run: "ClassRun") -> str:
    """One line: graded, failed and skipped counts, the time, the pool, the rate, the gradebook."""
    a = ", ".join(run.assignments)
    return (f"{a}: {len(run.graded)} graded, {len(run.failures)} failed, {len(run.skipped)} skipped in "
            f"{fmt_seconds(run.wall_seconds)} ({run.mode}, {run.workers} worker{'s' if run.workers != 1 else ''}, "
            f"{run.per_minute():.1f} students/min); gradebook {db_identity(run.db_url)}"
            + (f"; SQLite integrity_check: {run.sqlite_check}" if run.sqlite_check else ""))


def format_runs(run: "ClassRun") -> str:
    """The table of a run (:func:`run_rows`, made by :func:`table`), then its summary line."""
    header = ["student", "status", "score", "time", "try", "reason"]
    return "\n".join(table(header, run_rows(run)) + ["", run_summary(run)])


# --------------------------------------------------------------------------------------- the class
@dataclasses.dataclass
class ClassRun:
    """The outcome of a class run: the course's one result type, whoever graded the class.

    :func:`run_class` (the course command and ``make demo``) fills every field: each step's
    outcome, plus the gradebook read back (:meth:`report` is ``grading_report.json``).
    :func:`.parallel.grade_class` (one assignment fanned out) fills the grading part: ``runs``,
    ``results`` (the tasks' result dicts, with ``attempt``, ``host`` and the gradebook's ``score``),
    ``skipped``, ``mode``, ``wall_seconds`` and ``sqlite_check`` (:meth:`to_json` is its ``--json``;
    :func:`format_runs` its table).
    """

    root: Path
    db_url: str
    assignments: list
    runs: list  # [StudentRun], one per (student, assignment) graded in this run
    collected: CollectResult = dataclasses.field(default_factory=lambda: CollectResult([], {}))
    feedback: dict = dataclasses.field(default_factory=dict)  # {assignment: {student: [paths]}}
    csv_path: Path | None = None
    grades: Grades | None = None
    seconds: dict = dataclasses.field(default_factory=dict)  # step -> wall seconds
    integrity: dict = dataclasses.field(default_factory=dict)  # [trust] {assignment: IntegrityReport}
    feedback_leaks: dict = dataclasses.field(default_factory=dict)  # [trust] {page: [lines]}, pages removed
    workers: int = 1  # the pool that graded the class
    seeds: dict = dataclasses.field(default_factory=dict)  # {assignment: {rebuilt, seconds, entries, problem}}
    mode: str = "sequential"  # 'sequential' | 'parallel'
    results: list = dataclasses.field(default_factory=list)  # [dict] (orchestrator.grade_submission), when kept
    skipped: dict = dataclasses.field(default_factory=dict)  # already graded: {student: (score, max) or None}
    wall_seconds: float = 0.0  # the grading's wall time
    sqlite_check: str | None = None  # SQLite ``PRAGMA integrity_check`` after the run ('ok' when sound)

    @property
    def failures(self) -> list:
        return [r for r in self.runs if not r.ok]

    @property
    def graded(self) -> list:
        return [r for r in self.runs if r.ok]

    def per_minute(self) -> float:
        """Students finished (graded or failed) per minute of grading wall time."""
        return len(self.runs) / self.wall_seconds * 60 if self.wall_seconds > 0 else 0.0

    def to_json(self) -> dict:
        """One assignment's fan-out as ``--json`` of :mod:`.parallel` writes it."""
        return {"assignment": self.assignments[0] if len(self.assignments) == 1 else self.assignments,
                "mode": self.mode, "workers": self.workers, "db": db_identity(self.db_url),
                "results": self.results, "skipped": self.skipped, "wall_seconds": self.wall_seconds,
                "integrity": self.sqlite_check, "students_per_minute": self.per_minute()}

    def reasons(self) -> dict:
        """``{(student, assignment): [text]}``: what went wrong or was done to each submission, for
        the grade table's reason column (:func:`student_reasons`)."""
        return student_reasons(self.runs, self.integrity, self.grades, self.collected.problems,
                               self.feedback_leaks)

    def report(self) -> dict:
        return {
            "root": str(self.root),
            "assignments": self.assignments,
            "collected": [list(x) for x in self.collected.collected],
            "collect_problems": {f"{s}/{a}": why for (s, a), why in self.collected.problems.items()},
            "runs": [r.to_dict() for r in self.runs],
            "feedback": {a: {s: [str(p.relative_to(self.root)) for p in ps] for s, ps in d.items()}
                         for a, d in self.feedback.items()},
            "csv": str(self.csv_path),
            "seconds": self.seconds,
            "integrity": {a: rep.to_dict() for a, rep in self.integrity.items()},  # [trust]
            "feedback_withheld_for_leaks": self.feedback_leaks,  # [trust] pages removed by the hidden-text check
            "workers": self.workers,
            "compile_cache_seeds": self.seeds,
            "reasons": {f"{s}/{a}": texts for (s, a), texts in sorted(self.reasons().items())},
        }


def _short(text: str, limit: int = 140) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def student_reasons(runs: Sequence[StudentRun] = (), integrity: dict | None = None, grades: Grades | None = None,
                    problems: dict | None = None, feedback_leaks: dict | None = None) -> dict:
    """``{(student, assignment): [text]}``: per submission, what the grade table's reason column says.

    * the integrity pre-flight (``integrity/<assignment>.json``): a student it kept from grading
      ("blocked"), the points it withheld for review (the cells' points, read from the gradebook's
      layout, with the finding), other blocking findings, answers flagged as a copy of a library
      function ("library copy flagged"), and how many warnings it wrote (repairs, moved files);
    * a failed autograde run (its reason) and a run's notes (missing notebook, late, a cell stopped
      by the per-cell timeout);
    * collect problems (``problems``: ``{(student, assignment or ""): text}``) and feedback pages
      removed because they showed hidden text (``feedback_leaks``: ``{page path: lines}``).
    """
    out: dict = {}

    def add(key, text):
        if text and text not in out.setdefault(key, []):
            out[key].append(text)

    layout = grades.layout if grades is not None else {}
    for a, report in (integrity or {}).items():
        if report is None:
            continue
        points = {(nb, gid): mx for (nb, gid, _, mx) in layout.get(a, [])}
        blocked = set(report.ungradable())
        for sid in sorted({f.student for f in report.findings}):
            key = (sid, a)
            mine = report.for_student(sid)
            if sid in blocked:
                add(key, "pre-flight blocked grading: " + _short(
                    "; ".join(dict.fromkeys(f.message for f in mine if f.blocking)), 200))
                continue
            withheld = {(Path(nb).stem, gid) for f in mine if f.blocking for (nb, gid) in f.withhold}
            if withheld:
                n = sum(points.get(c, 0.0) for c in withheld)
                first = next(f for f in mine if f.blocking and f.withhold)
                add(key, f"pre-flight withheld {n:g} points for review ({len(withheld)} cell"
                         f"{'s' if len(withheld) != 1 else ''}; {first.code}: {_short(first.message, 100)})")
            for f in mine:
                if f.blocking and not f.withhold:
                    add(key, f"pre-flight: {_short(f.message, 120)}")
            copies = [f for f in mine if f.code == "library-copy"]
            if copies:
                add(key, f"library copy flagged ({len(copies)}): "
                         + _short(copies[0].message.split("; reported for review")[0], 100))
            other = [f for f in mine if not f.blocking and f.code != "library-copy"]
            if other:
                codes = ", ".join(dict.fromkeys(f.code for f in other))
                add(key, f"pre-flight: {len(other)} warning{'s' if len(other) != 1 else ''} ({codes}; "
                         f"integrity/{a}.json)")
    for r in runs:
        key = (r.student, r.assignment)
        if not r.ok:
            add(key, "autograde failed: " + _short(r.reason, 200))
        for note in r.notes:
            add(key, _short(note, 120))
    for (sid, a), text in (problems or {}).items():
        add((sid, a), _short(text, 160))
    for page in sorted(feedback_leaks or {}):
        parts = Path(page).parts  # feedback/<student>/<assignment>/<notebook>.html
        if len(parts) >= 4:
            add((parts[1], parts[2]), f"feedback {Path(page).stem} withheld: it showed hidden-test or source text")
    return out


#: What a working copy of the course needs (the helper library is imported from the installed package).
COURSE_FILES = ("nbgrader_config.py", "source", "release", "examples", ".cache")


def copy_course(dest: str | os.PathLike, root=None, include: Sequence[str] = COURSE_FILES,
                assignments: Sequence[str] | None = None) -> Path:
    """Copy the course (config, source, release, examples, compile cache seeds) into ``dest``.

    Returns ``dest``, resolved. The compile cache seeds (``.cache/``) are copied when present:
    each carries its own validity key, so a stale one is rebuilt, never used wrongly.
    Pipeline outputs are never copied, so the copy starts clean; ``autograded/`` is created empty.
    With ``assignments``, only the config, ``source/<a>`` and the seeds of those assignments are
    copied (a class of one assignment, as the load tests and benchmarks build it).
    """
    root = course_root(root)
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "*.pyc")
    if assignments is not None:
        from ..grader.compile_cache import seed_dir

        shutil.copy2(root / "nbgrader_config.py", dest / "nbgrader_config.py")
        for a in assignments:
            shutil.copytree(root / "source" / a, dest / "source" / a, ignore=ignore)
            if seed_dir(root, a).is_dir():
                shutil.copytree(seed_dir(root, a), seed_dir(dest, a))
        return dest
    for name in include:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, dirs_exist_ok=True, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)
    (dest / "autograded").mkdir(exist_ok=True)
    return dest


def clean_outputs(root=None) -> None:
    """Remove the pipeline's outputs from ``root`` (keeps ``autograded/.gitkeep``)."""
    root = course_root(root)
    for name in OUTPUTS:
        p = root / name
        if p.is_dir():
            for child in p.iterdir():
                if child.name == ".gitkeep":
                    continue
                shutil.rmtree(child) if child.is_dir() else child.unlink()
            if not any(p.iterdir()):
                p.rmdir()
        elif p.exists():
            p.unlink()
    (root / "autograded").mkdir(exist_ok=True)


def run_class(submissions_dir: str | os.PathLike, root=None, db_url: str | None = None,
              names: Iterable[str] | None = None, students: Iterable[str] | None = None,
              fresh: bool = True, regenerate: bool = True, force: bool = True,
              grader=None, progress=None, compile_cache: bool = True,
              release_pending_feedback: bool = False, workers: int | None = None,
              reporter=None, seed_build: "SeedBuild | None" = None) -> ClassRun:
    """The whole pipeline on a folder of submissions: generate -> collect -> autograde -> feedback -> export.

    ``submissions_dir=None`` grades what is already in ``submitted/`` (after ``nbgrader collect``).
    Feedback of notebooks with answers awaiting a human grader is held back unless
    ``release_pending_feedback`` (see :func:`feedback`).

    ``fresh`` removes earlier outputs (and the SQLite gradebook) first. ``grader(assignment,
    students, root, db_url, force)`` may replace the sequential per-student loop (for example a
    Dask fan-out); it must return a list of :class:`StudentRun`. Writes ``<root>/grading_report.json``.
    Every feedback page written is checked for hidden-test and ``source/`` text
    (:func:`.feedback_filter.check_feedback`); a page that leaks is removed and listed in the report.

    ``workers`` (without ``grader``) grades the whole class as one pool of that size
    (:func:`.orchestrator.grade_assignments`: every assignment's pre-flight, then every
    (assignment, student) task, costliest first, on :class:`.executors.ClassExecutor`: the sequential
    executor for 1, a Dask LocalCluster of N for more), builds missing compile-cache seeds and
    writes feedback N at a time; the grades are the same as with one. ``None``: the sequential
    loop, one assignment after another. ``reporter`` (:class:`.progress.Reporter`) announces each
    phase with a bar and an estimate; ``progress(run)`` is still called after each student.
    ``seed_build`` is a :class:`SeedBuild` of ``names`` started earlier (it is waited for here).
    """
    from . import progress as progress_mod

    if submissions_dir is None and fresh:
        raise ValueError("run_class(None, fresh=True) would delete what nbgrader collect put in submitted/; "
                         "pass fresh=False to grade the collected submissions")
    rep = reporter or progress_mod.null_reporter()
    course = as_course(root, db_url)  # built once, passed to every step below
    root, db_url = course.path_root, course.db_url
    check_config(root, db_url)
    seconds = {}
    if fresh:
        clean_outputs(root)
    names = list(names) if names is not None else course.graded_assignments()
    n_workers = max(1, int(workers)) if workers is not None else 1
    t = time.perf_counter()
    if regenerate:
        generate(root, course.assignments(), db_url)
    seconds["generate"] = time.perf_counter() - t

    # a trusted JAX compilation cache per assignment, built from the source notebooks (or reused
    # when unchanged); each grading kernel gets a private copy (see compile_cache.py)
    t = time.perf_counter()
    seeds = {}
    if compile_cache:
        seeds = (seed_build.wait(rep) if seed_build is not None else ensure_seeds(course, names, n_workers, rep))
    elif seed_build is not None:
        seed_build.close()
    seconds["compile cache"] = time.perf_counter() - t

    t = time.perf_counter()
    if submissions_dir is None:  # already collected (nbgrader collect / zip_collect filled submitted/)
        collected = already_submitted(root, names, students)
    else:
        collected = collect(submissions_dir, root, names, students)
    seconds["collect"] = time.perf_counter() - t

    t = time.perf_counter()
    runs = []
    integrity_reports = {}
    who_of = {a: sorted({s for (s, aa) in collected.collected if aa == a}) for a in names}
    n_tasks = sum(len(v) for v in who_of.values())
    weights = {a: task_seconds(course, a) for a in names}
    with rep.phase("autograde", n_tasks, unit="submission", workers=n_workers,
                   weights=[weights[a] for a in names for _ in who_of[a]],
                   estimate=sum(weights[a] * len(who_of[a]) for a in names) / parallel_speed(n_workers),
                   what="one nbgrader autograde per student and assignment, after the integrity "
                        "pre-flight") as phase:
        def arrived(result: dict) -> None:
            phase.advance(weight=weights.get(result["assignment"], 1.0))
            if progress is not None:
                progress(to_student_run(result))

        if workers is not None and grader is None:
            # the one grading path as ONE pool for the class: pre-flights, then every task
            select = None if force else (lambda a, left: records.pending(course, a, left))
            order = (lambda tasks: sorted(tasks, key=lambda t: -weights.get(t[0].assignment, 0.0)))
            with ClassExecutor(n_workers) as executor:
                done_all = grade_assignments(course, who_of, executor, preflight=True, report_blocked=False,
                                             select=select, on_result=arrived, order=order)
            for a in names:
                done = done_all[a]
                integrity_reports[a] = done.report if done.report is not None else _empty_report(a)
                runs += [to_student_run(r) for r in done.results]
        else:
            for a in names:
                who = who_of[a]
                select = None if force else (lambda left, a=a: records.pending(course, a, left))
                # [trust] a pending student may have a partial autograded folder from a killed run, which
                # nbgrader would skip without --force: the students selected here are always (re)graded.
                # The one grading path: pre-flight -> executor (a pool of one, or the given grader) -> overrides.
                executor = _GraderExecutor(grader, root, db_url) if grader is not None else SequentialExecutor()
                on_result = arrived if grader is None else None
                done = grade_assignment(course, a, who, executor, preflight=True, report_blocked=False,
                                        select=select, on_result=on_result)
                integrity_reports[a] = done.report if done.report is not None else _empty_report(a)
                runs += [r if isinstance(r, StudentRun) else to_student_run(r) for r in done.results]
                if grader is not None:
                    phase.advance(len(who), weight=weights[a] * len(who))
    seconds["autograde"] = time.perf_counter() - t

    t = time.perf_counter()
    leaks: dict = {}
    fb = feedback_class(names, root, db_url, workers=n_workers, release_pending=release_pending_feedback,
                        leaks=leaks, reporter=rep)
    seconds["feedback"] = time.perf_counter() - t

    t = time.perf_counter()
    with rep.phase("export", 1, unit="file", estimate=PRIOR_SECONDS["export"], what="nbgrader export -> grades.csv"):
        csv_path = export_csv(root / "grades.csv", root, db_url, names)
    seconds["export"] = time.perf_counter() - t

    grades = read_grades(root, db_url)
    result = ClassRun(root, db_url, names, runs, collected=collected, feedback=fb, csv_path=csv_path,
                      grades=grades, seconds={k: round(v, 3) for k, v in seconds.items()}, integrity=integrity_reports,
                      feedback_leaks=leaks, workers=n_workers, mode="parallel" if n_workers > 1 else "sequential",
                      wall_seconds=seconds["autograde"],
                      seeds={a: {"rebuilt": r.rebuilt, "seconds": round(r.seconds, 3), "entries": r.entries,
                                 "problem": r.problem} for a, r in seeds.items()})
    (root / REPORT_NAME).write_text(json.dumps(result.report(), indent=1, sort_keys=True) + "\n")
    return result


# ------------------------------------------------------------------------------------ estimates
#: Seconds on a quiet 2-core machine, one thing at a time (``bench/results/demo.md``): the first
#: estimate of each phase, before its own items have been timed (then the measured rate takes over).
PRIOR_SECONDS = {
    "seed notebook": 8.0,  # running one source notebook to build the compile-cache seed
    "autograde start": 4.0,  # one student's nbgrader process, the pre-flight, the gradebook writes
    "autograde notebook": 5.5,  # and each notebook it executes
    "feedback notebook": 1.5,  # one feedback page
    "generate": 3.0,  # one nbgrader generate_assignment
    "export": 4.0,
}
#: How much faster N processes on N cores go than one (measured 1.64x on 2 cores, bench/results/parallel.md).
PARALLEL_EFFICIENCY = 0.64


def parallel_speed(workers: int) -> float:
    """The expected speed-up of ``workers`` processes on this machine's cores (1 for one)."""
    n = min(max(1, int(workers)), default_workers())
    return 1.0 + PARALLEL_EFFICIENCY * (n - 1)


def task_seconds(course, assignment: str) -> float:
    """The prior cost of one student's autograde of ``assignment`` (its notebooks)."""
    try:
        n = len(course.notebooks(assignment))
    except Exception:  # noqa: BLE001
        n = 1
    return PRIOR_SECONDS["autograde start"] + PRIOR_SECONDS["autograde notebook"] * n


def estimate_seconds(kind: str, units: float, workers: int = 1) -> float:
    """``units`` x the prior of ``kind`` (``"seed"``, ``"feedback"``: per notebook), over ``workers``."""
    per = PRIOR_SECONDS[f"{kind} notebook"]
    return units * per / parallel_speed(min(workers, max(1, int(units))))


# ----------------------------------------------------------------------------- compile-cache seeds
def _seed_is_fresh(root: Path, assignment: str) -> bool:
    """Whether the assignment's seed exists with the key it would be built with now (no build)."""
    from ..grader import compile_cache as cc

    try:
        manifest = json.loads((cc.seed_dir(root, assignment) / cc.MANIFEST).read_text())
        return isinstance(manifest, dict) and manifest.get("key") == cc.seed_key(Path(root), assignment)
    except (OSError, ValueError):
        return False


def _build_seed(root: str, assignment: str):
    """One seed (run in a process of its own by :func:`ensure_seeds`)."""
    from ..grader import compile_cache as cc

    return cc.ensure_seed(root, assignment)


def ensure_seeds(course, names: Iterable[str], workers: int = 1, reporter=None) -> dict:
    """Build (or reuse) the compile-cache seed of every assignment: ``{assignment: SeedResult}``.

    Up-to-date seeds are reused at once. The others are built by running their source notebooks
    (:func:`.compile_cache.ensure_seed`): with one worker here, one after another; with more,
    ``workers`` assignments at a time, each in a process of its own (:class:`SeedBuild`).
    ``reporter`` shows them.
    """
    return SeedBuild(course, names, workers).wait(reporter)


class SeedBuild:
    """The compile-cache seeds of a class run, started at once and waited for later (:meth:`wait`).

    With more than one worker the stale seeds are built in the background from the moment this
    object is made, ``workers`` at a time, each assignment in a process of its own (``spawn``: a
    clean interpreter that inherits nothing of this process's threads), so they run alongside the
    steps that do not need them (the demo starts them right after its course copy: generate, the
    roster and the exchange hand-in only use one core). Seeds never depend on the gradebook: the
    source notebooks, the library, JAX and the machine are their whole key. With one worker,
    nothing happens before :meth:`wait`, which builds them one after another in this process.
    """

    def __init__(self, course, names: Iterable[str], workers: int = 1):
        from ..grader import compile_cache as cc

        self.course = as_course(course)
        self.root = self.course.path_root
        self.names = list(names)
        self.workers = max(1, int(workers))
        self.results: dict = {}
        self.stale = [a for a in self.names if not _seed_is_fresh(self.root, a)]
        for a in self.names:
            if a not in self.stale:
                self.results[a] = cc.ensure_seed(self.root, a)  # the key matches: returns at once
        self.size = {a: max(1, len(list((self.root / "source" / a).glob("*.ipynb")))) for a in self.stale}
        self.stale.sort(key=lambda a: -self.size[a])  # the longest first: the pool ends together
        self.started = time.monotonic()
        self.pool = None
        self.futures: dict = {}
        if self.workers > 1 and len(self.stale) > 1:
            from concurrent.futures import ProcessPoolExecutor
            import multiprocessing

            self.pool = ProcessPoolExecutor(max_workers=min(self.workers, len(self.stale)),
                                            mp_context=multiprocessing.get_context("spawn"))
            self.futures = {self.pool.submit(_build_seed, str(self.root), a): a for a in self.stale}

    def close(self) -> None:
        """Stop a background build that will not be waited for (its processes are ended)."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        for proc in list(getattr(pool, "_processes", {}).values()):
            try:
                proc.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        pool.shutdown(wait=True, cancel_futures=True)

    def wait(self, reporter=None) -> dict:
        """Every seed, built or reused: ``{assignment: SeedResult}``; ``reporter`` shows the rest."""
        from concurrent.futures import as_completed

        from ..grader import compile_cache as cc
        from . import progress

        rep = reporter or progress.null_reporter()
        if not self.stale:
            return {a: self.results[a] for a in self.names}
        n = min(self.workers, len(self.stale))
        background = self.pool is not None
        est = sum(self.size.values()) * PRIOR_SECONDS["seed notebook"] / parallel_speed(n)
        with rep.phase("compile-cache seeds", len(self.stale), unit="assignment", workers=n,
                       weights=[self.size[a] for a in self.stale], estimate=est,
                       what="the source notebooks run once, so every grading kernel loads their compiled "
                            "programs instead of compiling them"
                            + ("; begun in the background after the copy" if background else "")) as phase:
            if background:
                phase.start = self.started  # the time and the estimate count from the start of the build
                try:
                    for fut in as_completed(self.futures):
                        a = self.futures[fut]
                        try:
                            self.results[a] = fut.result()
                        except Exception as exc:  # noqa: BLE001 - no seed: kernels compile as before
                            self.results[a] = cc.SeedResult(a, cc.seed_dir(self.root, a), 0, 0.0, rebuilt=False,
                                                            problem=f"the seed build failed: {type(exc).__name__}: "
                                                                    f"{exc}")
                        phase.advance(weight=self.size[a])
                finally:
                    self.close()
            else:
                for a in self.stale:
                    self.results[a] = cc.ensure_seed(self.root, a)
                    phase.advance(weight=self.size[a])
            for a in self.stale:
                r = self.results[a]
                if r.problem:
                    problem = re.sub(r"\x1b\[[0-9;]*m", "", r.problem)  # nbclient's coloured traceback
                    phase.write(f"   compile cache {a}: none ({problem}); its kernels compile from scratch")
        return {a: self.results[a] for a in self.names}


# ----------------------------------------------------------------------- a grader as an executor
class _GraderExecutor(Executor):
    """A ``grader(assignment, students, root, db_url, force)`` callable used as an executor."""

    mode = "grader"
    workers = 0

    def __init__(self, grader, root, db_url):
        self.grader, self.root, self.db_url = grader, root, db_url

    def describe(self, spec, n: int) -> str:
        return f"grading {n} student(s) of {spec.assignment}"

    def run(self, spec, students, on_result=None) -> list:
        return list(self.grader(spec.assignment, list(students), self.root, self.db_url, True))


def _empty_report(assignment: str):
    from ..grader import integrity

    return integrity.IntegrityReport(assignment, [], [])
