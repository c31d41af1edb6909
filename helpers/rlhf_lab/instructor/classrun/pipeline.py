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
student, run by an executor of any size) < this module and :mod:`.parallel` (the Dask executor).
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
    check_config, course_root, default_db_url, ensure_venv_on_path, graded_assignments, is_grade_cell,
    nbgrader_command, nbgrader_env, notebooks, run_nbgrader, submitted_students, venv_bin,
)
from ..course import kill_group as _kill_group  # noqa: F401
from ..course import log_lines as _log_lines  # noqa: F401
from .orchestrator import (  # noqa: F401
    SequentialExecutor, StudentRun, grade_assignment, grade_with_one_retry, make_spec, to_student_run,
)
from .orchestrator import NOTE_PATTERNS as _NOTE_PATTERNS  # noqa: F401
from .orchestrator import cell_timeouts as _cell_timeouts  # noqa: F401
from .orchestrator import command_reason as _reason  # noqa: F401

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
                                               float(g.max_score), bool(g.needs_manual_grade)))
    order = {(a, nb, gid): i for a, lay in layout.items() for i, (nb, gid, _, _) in enumerate(lay)}
    cells.sort(key=lambda c: (c.assignment, c.student, order.get((c.assignment, c.notebook, c.grade_id), 0)))
    return Grades(cells, totals, layout)


def _fmt(x: float | None) -> str:
    if x is None:
        return "manual"
    return f"{x:g}"


def format_tables(grades: Grades, runs: Sequence[StudentRun] = ()) -> str:
    """Two plain-text tables: per student (score / max per assignment) and per test cell x student."""
    failed = {(r.student, r.assignment): r.reason for r in runs if not r.ok}
    # assignments with something to grade (the widget explorer has no graded cell)
    names = sorted(a for a, lay in grades.layout.items() if lay)
    students = sorted({s for (s, _) in grades.totals} | {s for (s, _) in failed})
    lines = ["Grades per student (score / max; autograded points, manual answers pending)", ""]
    header = ["student"] + names
    rows = []
    for sid in students:
        row = [sid]
        for a in names:
            if (sid, a) in failed:
                row.append("FAILED")
            elif (sid, a) in grades.totals:
                s, m = grades.totals[(sid, a)]
                row.append(f"{s:g} / {m:g}")
            else:
                row.append("-")
        rows.append(row)
    lines += _table(header, rows)
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
        lines += _table(header, rows)
        legend = [f"{short[s]} = {s}" for s in subs if short[s] != s]
        if legend:
            lines += ["", "columns: " + ", ".join(legend)]
    if failed:
        lines += ["", "Failed autograde runs", ""]
        lines += _table(["student", "assignment", "reason"], [[s, a, r] for (s, a), r in sorted(failed.items())])
    return "\n".join(lines)


def _short_names(students: Sequence[str]) -> dict:
    """Column headers: the part of each id before its first ``_`` when that is unique, else the id."""
    heads = [s.split("_", 1)[0] for s in students]
    return {s: (h if h and heads.count(h) == 1 else s) for s, h in zip(students, heads)}


def _table(header: list, rows: list) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


# --------------------------------------------------------------------------------------- the class
@dataclasses.dataclass
class ClassRun:
    """The result of :func:`run_class`: every step's outcome, plus the gradebook read back."""

    root: Path
    db_url: str
    assignments: list
    collected: CollectResult
    runs: list  # [StudentRun]
    feedback: dict  # {assignment: {student: [paths]}}
    csv_path: Path
    grades: Grades
    seconds: dict  # step -> wall seconds
    integrity: dict = dataclasses.field(default_factory=dict)  # [trust] {assignment: IntegrityReport}
    feedback_leaks: dict = dataclasses.field(default_factory=dict)  # [trust] {page: [lines]}, pages removed

    @property
    def failures(self) -> list:
        return [r for r in self.runs if not r.ok]

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
        }


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
              release_pending_feedback: bool = False) -> ClassRun:
    """The whole pipeline on a folder of submissions: generate -> collect -> autograde -> feedback -> export.

    ``submissions_dir=None`` grades what is already in ``submitted/`` (after ``nbgrader collect``).
    Feedback of notebooks with answers awaiting a human grader is held back unless
    ``release_pending_feedback`` (see :func:`feedback`).

    ``fresh`` removes earlier outputs (and the SQLite gradebook) first. ``grader(assignment,
    students, root, db_url, force)`` may replace the sequential per-student loop (for example a
    Dask fan-out); it must return a list of :class:`StudentRun`. Writes ``<root>/grading_report.json``.
    Every feedback page written is checked for hidden-test and ``source/`` text
    (:func:`.feedback_filter.check_feedback`); a page that leaks is removed and listed in the report.
    """
    if submissions_dir is None and fresh:
        raise ValueError("run_class(None, fresh=True) would delete what nbgrader collect put in submitted/; "
                         "pass fresh=False to grade the collected submissions")
    course = as_course(root, db_url)  # built once, passed to every step below
    root, db_url = course.path_root, course.db_url
    check_config(root, db_url)
    seconds = {}
    if fresh:
        clean_outputs(root)
    names = list(names) if names is not None else course.graded_assignments()
    t = time.perf_counter()
    if regenerate:
        generate(root, course.assignments(), db_url)
    seconds["generate"] = time.perf_counter() - t

    # a trusted JAX compilation cache per assignment, built from the source notebooks (or reused
    # when unchanged); each grading kernel gets a private copy (see compile_cache.py)
    t = time.perf_counter()
    if compile_cache:
        from .orchestrator import ensure_compile_cache

        ensure_compile_cache(course, names)
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
    for a in names:
        who = sorted({s for (s, aa) in collected.collected if aa == a})
        select = None if force else (lambda left, a=a: records.pending(course, a, left))
        # [trust] a pending student may have a partial autograded folder from a killed run, which
        # nbgrader would skip without --force: the students selected here are always (re)graded.
        # The one grading path: pre-flight -> executor (a pool of one, or the given grader) -> overrides.
        executor = _GraderExecutor(grader, root, db_url) if grader is not None else SequentialExecutor()
        on_result = (lambda result: progress(to_student_run(result))) if progress is not None and grader is None \
            else None
        done = grade_assignment(course, a, who, executor, preflight=True, report_blocked=False,
                                select=select, on_result=on_result)
        integrity_reports[a] = done.report if done.report is not None else _empty_report(a)
        runs += [r if isinstance(r, StudentRun) else to_student_run(r) for r in done.results]
    seconds["autograde"] = time.perf_counter() - t

    t = time.perf_counter()
    leaks: dict = {}
    fb = {a: feedback(a, root, db_url, release_pending=release_pending_feedback, leaks=leaks) for a in names}
    seconds["feedback"] = time.perf_counter() - t

    t = time.perf_counter()
    csv_path = export_csv(root / "grades.csv", root, db_url, names)
    seconds["export"] = time.perf_counter() - t

    grades = read_grades(root, db_url)
    result = ClassRun(root, db_url, names, collected, runs, fb, csv_path, grades,
                      {k: round(v, 3) for k, v in seconds.items()}, integrity=integrity_reports,
                      feedback_leaks=leaks)
    (root / REPORT_NAME).write_text(json.dumps(result.report(), indent=1, sort_keys=True) + "\n")
    return result


class _GraderExecutor:
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
