"""The instructor pipeline: generate -> collect -> autograde -> feedback -> export, on real nbgrader.

Every step runs the real nbgrader command line (:func:`nbgrader_command`) in a subprocess whose
working directory is the course root and whose ``PATH`` starts with this interpreter's ``bin``
(nbgrader shells out to the bare ``alembic`` command when it creates a gradebook). The course root
and the gradebook URL reach ``nbgrader_config.py`` through ``RLHF_COURSE_ROOT`` and
``RLHF_COURSE_DB``, so the same functions run on the repository or on a copy of it.

Each student is autograded in its own ``nbgrader autograde ASSIGNMENT --student ID`` process (its
own process group, killed as a whole on the per-student time limit), so a bad submission fails
alone and is recorded with a reason while the rest of the class is graded.

Functions (all take ``root=None`` -> :func:`course_root`, and ``db_url=None`` -> the config's
default, SQLite ``<root>/gradebook.db``):

=========================  ===================================================================
``generate()``             ``nbgrader generate_assignment A --force`` for every assignment
``validate(paths)``        ``nbgrader validate`` -> :class:`ValidateResult` per notebook
``collect(subs_dir)``      copy ``<subs>/<student>/<assignment>/`` into ``submitted/``
``autograde(a, student)``  one process per student -> list of :class:`StudentRun`
``autograde_student``      one student, picklable arguments and result (for a Dask worker)
``feedback(a)``            ``nbgrader generate_feedback`` -> HTML per student
``export_csv(path)``       ``nbgrader export`` -> CSV, one row per student and assignment
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
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

import nbformat

COURSE_ID = "rlhf-ppo"
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_STUDENT_TIMEOUT = float(os.environ.get("RLHF_STUDENT_TIMEOUT", "900"))
REPORT_NAME = "grading_report.json"
#: Outputs of the pipeline inside the course root (all gitignored; ``autograded/.gitkeep`` stays).
OUTPUTS = ("submitted", "autograded", "feedback", "gradebook.db", "grades.csv", REPORT_NAME,
           "integrity",  # [trust] integrity/<assignment>.json and integrity/quarantine/
           ".autograde_runs")  # [trust] one run record per student and assignment (resume)


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
        return _log_lines(self.output, "ERROR")

    def warnings(self) -> list[str]:
        return _log_lines(self.output, "WARNING")


_LOG_LINE = re.compile(r"^\[(?P<app>\w+) \| (?P<level>[A-Z]+)\]\s?(?P<msg>.*)$")


def _log_lines(output: str, level: str) -> list[str]:
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
    return [sys.executable, str(Path(__file__).with_name("nbgrader_cli.py"))]


def run_nbgrader(args: Sequence[str], root=None, db_url: str | None = None,
                 timeout: float | None = None, extra_env: dict | None = None,
                 started=None) -> CommandRun:
    """Run nbgrader (:func:`nbgrader_command`) with ``args`` in the course root; never raises on failure.

    The command gets its own process group; on ``timeout`` the whole group (nbgrader and the
    kernels it started) is killed and the run is marked ``timed_out``. ``started(pid)``, when
    given, is called once the process exists.
    """
    root = course_root(root)
    cmd = [*nbgrader_command(), *map(str, args)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, env=nbgrader_env(root, db_url, extra_env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    if started is not None:
        try:
            started(proc.pid)
        except BaseException:
            _kill_group(proc)
            proc.communicate()
            raise
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        output, _ = proc.communicate()
    except BaseException:  # KeyboardInterrupt: never leave nbgrader or its kernels behind
        _kill_group(proc)
        proc.communicate()
        raise
    return CommandRun(list(cmd[1:]), proc.returncode, time.perf_counter() - start, output, timed_out)


def _kill_group(proc: subprocess.Popen) -> None:
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
        for adir in sorted(p for p in student_dir.iterdir()):
            if not adir.is_dir():
                problems[(student, "")] = f"unexpected file {adir.name!r} beside the assignment folders"
                continue
            if adir.name not in known:
                problems[(student, adir.name)] = f"unknown assignment folder {adir.name!r}"
                continue
            dest = root / "submitted" / student / adir.name
            if dest.exists() and clean:
                shutil.rmtree(dest)
            shutil.copytree(adir, dest, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
            collected.append((student, adir.name))
    return CollectResult(collected, problems)


def already_submitted(root=None, names: Iterable[str] | None = None,
                      students: Iterable[str] | None = None) -> CollectResult:
    """What is in ``submitted/`` now (put there by ``nbgrader collect`` or ``zip_collect``), as a
    :class:`CollectResult` of the known assignments (and ``students``, when given)."""
    root = course_root(root)
    known = list(names) if names is not None else assignments(root)
    wanted = set(students) if students is not None else None
    pairs = [(sid, a) for a in known for sid in submitted_students(a, root) if wanted is None or sid in wanted]
    return CollectResult(sorted(pairs), {})


def submitted_students(assignment: str, root=None) -> list[str]:
    """Students with a ``submitted/<student>/<assignment>/`` folder, sorted."""
    sub = course_root(root) / "submitted"
    if not sub.is_dir():
        return []
    return sorted(p.name for p in sub.iterdir() if (p / assignment).is_dir())


# --------------------------------------------------------------------------------------- autograde
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


_NOTE_PATTERNS = (
    ("No submitted file", "missing notebook"),
    ("Skipping unknown notebook", "unknown notebook (not part of the assignment)"),
    ("is late", "late submission"),
)


def _reason(run: CommandRun) -> str:
    if run.timed_out:
        return f"autograde did not finish within {run.seconds:.0f} s; the process group was killed"
    text = run.output
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
        if needle in text:
            return why
    errors = [e for e in run.errors() if not e.startswith("Please see")]
    if errors:
        return errors[0][:500]
    return f"nbgrader exited with code {run.returncode}"


def _cell_timeouts(path: Path) -> list[str]:
    notes = []
    for nb_path in sorted(path.glob("*.ipynb")):
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


def autograde_student(assignment: str, student: str, root=None, db_url: str | None = None,
                      force: bool = True, timeout: float | None = None, course=None) -> StudentRun:
    """Autograde one student's assignment with its own ``nbgrader autograde`` process.

    Never raises for a bad submission: failures come back as ``ok=False`` with a ``reason``.
    Arguments and result are plain data, so this can run as a Dask task. ``course`` (the course's
    :class:`~rlhf_lab.instructor.parallel.Course`, for the run records) is read from its config
    when not given.
    """
    from . import parallel  # the run records (shared with the parallel command; no JAX import)

    timeout = DEFAULT_STUDENT_TIMEOUT if timeout is None else timeout
    course = course or parallel.load_course(course_root(root), db_url or default_db_url(root))
    # [trust] a 'running' record now, 'done' only after nbgrader exits: a run killed in the middle
    # leaves 'running', and the re-run grades this student again (see pending())
    record = parallel.begin_record(course, assignment, student, course.db_url)
    args = ["autograde", assignment, "--student", student] + (["--force"] if force else [])
    run = run_nbgrader(args, root, db_url, timeout=timeout,
                       started=lambda pid: parallel.note_child(course, assignment, student, record, pid))
    notes = []
    for warning in run.warnings():
        for needle, why in _NOTE_PATTERNS:
            if needle in warning:
                notes.append(f"{why}: {warning}")
    dest = course_root(root) / "autograded" / student / assignment
    if run.ok:
        notes.extend(_cell_timeouts(dest))
    ok = run.ok and dest.is_dir() and any(dest.glob("*.ipynb"))
    reason = "" if ok else (_reason(run) if not run.ok else "nbgrader wrote no autograded notebook")
    with open(parallel.log_path(course, assignment, student), "w", encoding="utf-8", errors="replace") as log:
        log.write("$ nbgrader " + " ".join(args) + "\n" + run.output)
    parallel.finish_record(course, assignment, student, record, state="done" if ok else "failed",
                           seconds=run.seconds, returncode=run.returncode, reason=reason)
    tail = "\n".join(run.output.splitlines()[-40:])
    return StudentRun(student, assignment, ok, round(run.seconds, 3), run.returncode, reason, notes, tail)


def autograde(assignment: str, student: str | Iterable[str] | None = None, root=None,
              db_url: str | None = None, force: bool = True, timeout: float | None = None,
              progress=None) -> list[StudentRun]:
    """Autograde ``assignment`` for one student, several, or everyone in ``submitted/``, one process each.

    ``progress(run)`` is called after each student (for printing). Failures are returned, not raised.
    """
    if student is None:
        students = submitted_students(assignment, root)
    elif isinstance(student, str):
        students = [student]
    else:
        students = list(student)
    from . import parallel

    course = parallel.load_course(course_root(root), db_url or default_db_url(root))  # read once
    runs = []
    for sid in students:
        run = autograde_student(assignment, sid, root, db_url, force, timeout, course=course)
        runs.append(run)
        if progress is not None:
            progress(run)
    return runs


def pending(assignment: str, root=None, db_url: str | None = None) -> list[str]:
    """Submitted students whose last autograde of this submission into this gradebook did not finish.

    [trust] Finished means: the student's run record (``.autograde_runs/<assignment>/``, written by
    :func:`autograde_student` and by the parallel command) says ``done`` for this gradebook and for
    exactly the submitted files, the autograded notebooks exist and the gradebook has the
    submission. Files in ``autograded/`` alone prove nothing: nbgrader writes each notebook there
    before running it, so a run killed in the middle of a notebook leaves it with empty grades.
    """
    from nbgrader.api import Gradebook

    from . import parallel

    root = course_root(root)
    db_url = db_url or default_db_url(root)
    students = submitted_students(assignment, root)
    try:
        ensure_venv_on_path()
        with Gradebook(db_url, COURSE_ID) as gb:
            in_db = {s.student.id for s in gb.find_assignment(assignment).submissions}
    except Exception:  # noqa: BLE001 - no gradebook or no such assignment yet: everything is pending
        in_db = set()
    course = parallel.load_course(root, db_url)
    return [sid for sid in students if not parallel.is_completed(course, assignment, sid, course.db_url, in_db)]


# ---------------------------------------------------------------------------------------- feedback
def feedback(assignment: str, root=None, db_url: str | None = None,
             students: Iterable[str] | None = None, release_pending: bool = False) -> dict:
    """``nbgrader generate_feedback`` for ``assignment``; returns ``{student: [html paths]}``.

    One call for the whole assignment; if it fails, each student is retried alone so one broken
    autograded notebook cannot cost the others their feedback.

    Feedback for a notebook with an answer still waiting for a human grader is **held back**:
    its HTML is removed again, so ``nbgrader release_feedback`` cannot hand it out, and
    :func:`held_feedback` lists it. ``release_pending=True`` keeps it; such a page then says
    "awaiting grading" for those answers instead of a score of 0 (``feedback_filter.MarkPendingGrades``).
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
                if path.exists():
                    path.unlink()
    return feedback_files(assignment, root)


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
    """``nbgrader export`` to ``path`` (default ``<root>/grades.csv``): one row per student and assignment."""
    root = course_root(root)
    dest = Path(path).resolve() if path is not None else root / "grades.csv"
    args = ["export", "--to", str(dest)]
    if names is not None:
        args += ["--CsvExportPlugin.assignment=" + json.dumps(list(names))]
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
        }


#: What a working copy of the course needs (the helper library is imported from the installed package).
COURSE_FILES = ("nbgrader_config.py", "source", "release", "examples", ".cache")


def copy_course(dest: str | os.PathLike, root=None, include: Sequence[str] = COURSE_FILES) -> Path:
    """Copy the course (config, source, release, examples, compile cache seeds) into ``dest``.

    Returns ``dest``, resolved. The compile cache seeds (``.cache/``) are copied when present:
    each carries its own validity key, so a stale one is rebuilt, never used wrongly.
    Pipeline outputs are never copied, so the copy starts clean; ``autograded/`` is created empty.
    """
    root = course_root(root)
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "*.pyc")
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
    """
    from . import integrity  # [trust] pre-flight checks and overrides around autograde

    if submissions_dir is None and fresh:
        raise ValueError("run_class(None, fresh=True) would delete what nbgrader collect put in submitted/; "
                         "pass fresh=False to grade the collected submissions")
    root = course_root(root)
    db_url = db_url or default_db_url(root)
    check_config(root, db_url)
    seconds = {}
    if fresh:
        clean_outputs(root)
    names = list(names) if names is not None else graded_assignments(root)
    t = time.perf_counter()
    if regenerate:
        generate(root, assignments(root), db_url)
    seconds["generate"] = time.perf_counter() - t

    # a trusted JAX compilation cache per assignment, built from the source notebooks (or reused
    # when unchanged); each grading kernel gets a private copy (see compile_cache.py)
    t = time.perf_counter()
    if compile_cache:
        from . import compile_cache as cc

        for a in names:
            cc.ensure_seed(root, a)
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
        # [trust] pre-flight integrity checks (quarantine what must not run; see integrity.py)
        integrity_reports[a] = integrity.preflight(a, root, who)
        who = [s for s in who if s not in set(integrity_reports[a].ungradable())]
        if not force:
            who = [s for s in who if s in set(pending(a, root, db_url))]
        # [trust] a pending student may have a partial autograded folder from a killed run, which
        # nbgrader would skip without --force: the students selected here are always (re)graded.
        if grader is not None:
            runs += grader(a, who, root, db_url, True)
        else:
            runs += autograde(a, who, root, db_url, True, progress=progress)
        # [trust] withhold points of blocked cells (nbgrader manual-score override, flagged, comment)
        integrity.apply_overrides(integrity_reports[a], root, db_url)
    seconds["autograde"] = time.perf_counter() - t

    t = time.perf_counter()
    fb = {a: feedback(a, root, db_url, release_pending=release_pending_feedback) for a in names}
    seconds["feedback"] = time.perf_counter() - t

    t = time.perf_counter()
    csv_path = export_csv(root / "grades.csv", root, db_url, names)
    seconds["export"] = time.perf_counter() - t

    grades = read_grades(root, db_url)
    result = ClassRun(root, db_url, names, collected, runs, fb, csv_path, grades,
                      {k: round(v, 3) for k, v in seconds.items()}, integrity=integrity_reports)
    (root / REPORT_NAME).write_text(json.dumps(result.report(), indent=1, sort_keys=True) + "\n")
    return result
