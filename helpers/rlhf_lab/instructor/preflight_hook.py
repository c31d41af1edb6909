"""The integrity pre-flight inside every ``nbgrader autograde``, through nbgrader's convert hooks.

``nbgrader_config.py`` sets ``c.Autograde.pre_convert_hook`` and ``c.Autograde.post_convert_hook``
to the two methods of one :class:`PreflightHooks`. nbgrader's converter
(``nbgrader.converters.base.BaseConverter.convert_notebooks``) calls them once per student
submission, whoever started the autograde: ``nbgrader autograde`` on the command line,
Formgrader's Autograde button (nbgrader's API, inside the Jupyter server), the course's commands
and the Dask workers. So the same submitted files get the same findings and the same withheld
points on every path.

Per submission ``submitted/<student>/<assignment>/``:

* **before conversion** (:meth:`PreflightHooks.pre`): :func:`rlhf_lab.instructor.integrity.preflight`
  checks that one folder against ``release/<assignment>/`` and moves what must not run (a broken
  notebook, a notebook of the other assignment, a ``numpy.py`` that would shadow NumPy, a symbolic
  link) to ``integrity/quarantine/``. The converter's ``notebooks`` list is the list nbgrader goes
  on to grade, passed by reference: quarantined paths are removed from it *in place*, so nbgrader
  never runs them (it then scores a notebook it cannot find 0, as it does for a missing one). The
  student's findings replace their earlier ones in ``integrity/<assignment>.json`` (the other
  students' are kept; a file lock serialises parallel graders).
* **after conversion** (:meth:`PreflightHooks.post`), once nbgrader's ``SaveAutoGrades`` has
  written the auto scores: :func:`rlhf_lab.instructor.integrity.apply_overrides` withholds the
  points of every cell a blocking finding names (``manual_score = 0``, notebook flagged, reason in
  the comment).

Both steps are idempotent. A second pre-flight of the same folder (the course command runs its
own before it starts nbgrader) finds the quarantined files' records and reports the same findings;
a second override writes the same scores and replaces its own comment.

Failing closed: nbgrader catches every exception a hook raises and only logs it at INFO level,
then grades on. When the pre-flight itself fails, :meth:`PreflightHooks.pre` logs the error and
empties ``notebooks``, so nbgrader stops this submission ("No notebooks found") instead of grading
files nobody checked. A student folder nbgrader cannot address (a name with ``* ? [ ]``) is
stopped the same way.

This module imports only the standard library at load time (``nbgrader_config.py`` loads it by its
file path, so nbgrader's start-up never imports JAX); the integrity module is imported on the first
call, in the grading process, which imports the course library for the judge anyway.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from pathlib import Path

#: Characters that make an nbgrader id a glob pattern rather than one student or assignment.
GLOB_CHARS = "*?["
#: Guards the reports kept between the two hooks (Formgrader's server may grade in several threads).
_LOCK = threading.Lock()


def _log() -> logging.Logger:
    try:
        from traitlets import log as tlog

        return tlog.get_logger()  # the running nbgrader app's logger (or traitlets' default)
    except Exception:  # noqa: BLE001
        return logging.getLogger("rlhf_lab.preflight")


def _integrity():
    """:mod:`rlhf_lab.instructor.integrity`, imported by name (this file may be loaded by its path,
    outside the package, so a relative import would not work)."""
    from rlhf_lab.instructor import integrity

    return integrity


def _concrete(name) -> bool:
    return bool(name) and not any(ch in str(name) for ch in GLOB_CHARS)


def submission_of(notebooks, assignment=None, student=None) -> tuple[str | None, str | None]:
    """``(assignment, student)`` of one submission: the hook's arguments when they name one, else
    read from the paths ``.../submitted/<student>/<assignment>/<notebook>.ipynb`` (nbgrader passes
    the command line's ids, which are ``*`` when the instructor autogrades a whole class)."""
    if notebooks:
        folder = Path(notebooks[0]).parent
        assignment = assignment if _concrete(assignment) else folder.name
        student = student if _concrete(student) else folder.parent.name
    return (assignment if _concrete(assignment) else None, student if _concrete(student) else None)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` (created if needed) for the duration of the block."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def merge_report(root: Path, report) -> Path:
    """Write ``report``'s students into ``<root>/integrity/<assignment>.json``, keeping the others.

    Findings are kept in student order (the order of a whole-class pre-flight), so the file a
    per-student run leaves equals the one the course command writes for the same files.
    """
    integrity = _integrity()
    path = Path(root) / integrity.REPORT_TEMPLATE.format(assignment=report.assignment)
    with _locked(path.with_name("." + path.name + ".lock")):
        old = {"students": [], "findings": []}
        if path.is_file():
            try:
                old = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                pass
        mine = set(report.students)
        students = sorted(set(old.get("students", [])) | mine)
        kept = [f for f in old.get("findings", []) if f.get("student") not in mine]
        findings = kept + [f.to_dict() for f in report.findings]
        order = {s: i for i, s in enumerate(students)}
        findings.sort(key=lambda f: order.get(f.get("student"), len(order)))  # stable within a student
        data = {"assignment": report.assignment, "students": students, "findings": findings}
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    return path


class PreflightHooks:
    """The pre-flight (:meth:`pre`) and its withheld points (:meth:`post`) of one course.

    ``root`` is the course root and ``db_url`` its gradebook, both as ``nbgrader_config.py``
    resolves them. One instance serves every submission of the process (a Jupyter server running
    Formgrader grades many); the report of each submission is kept between its two hooks.
    """

    def __init__(self, root, db_url: str, quarantine: bool = True):
        self.root = Path(root)
        self.db_url = db_url
        self.quarantine = quarantine
        self._reports: dict = {}

    # traitlets deep-copies config values: every copy must be this same object, so the report of a
    # submission's pre hook reaches its post hook (and a copy never splits that state)
    def __deepcopy__(self, memo):
        return self

    def __copy__(self):
        return self

    # -- nbgrader's pre_convert_hook ----------------------------------------------------------
    def pre(self, assignment=None, student=None, notebooks=None, **_ignored) -> None:
        """Check the submission, quarantine what must not run, drop it from ``notebooks`` in place."""
        if notebooks is None:
            notebooks = []
        log = _log()
        a, s = submission_of(notebooks, assignment, student)
        if a is None or s is None:
            return  # nothing nbgrader could grade here (it reports that itself)
        try:
            integrity = _integrity()

            report = integrity.preflight(a, self.root, [s], quarantine=self.quarantine, write=False)
            if report.students:
                merge_report(self.root, report)
        except Exception:
            log.error("integrity pre-flight of %s/%s failed; the submission is NOT graded", s, a,
                      exc_info=True)
            notebooks[:] = []
            raise
        with _LOCK:
            self._reports[(a, s)] = report
        if s in report.ungradable():
            log.error("integrity pre-flight: %s/%s cannot be graded: %s", s, a,
                      "; ".join(f.message for f in report.for_student(s)))
            notebooks[:] = []
            return
        gone = [p for p in notebooks if not os.path.isfile(p) or os.path.islink(p)]
        if gone:
            notebooks[:] = [p for p in notebooks if p not in gone]
        for f in report.blocking(s):
            log.warning("integrity pre-flight: %s", f.text())
        if gone:
            log.warning("integrity pre-flight: not run (quarantined): %s",
                        ", ".join(os.path.basename(p) for p in gone))

    # -- nbgrader's post_convert_hook ---------------------------------------------------------
    def post(self, assignment=None, student=None, notebooks=None, **_ignored) -> None:
        """Withhold the points of the cells the submission's blocking findings name."""
        log = _log()
        a, s = submission_of(notebooks or [], assignment, student)
        if a is None or s is None:
            return
        with _LOCK:
            report = self._reports.pop((a, s), None)
        try:
            integrity = _integrity()

            if report is None:  # the pre hook did not run for it in this process: check again
                report = integrity.preflight(a, self.root, [s], quarantine=self.quarantine, write=False)
            done = integrity.apply_overrides(report, self.root, self.db_url)
        except Exception:
            log.error("integrity overrides of %s/%s failed: withheld points are NOT applied; run "
                      "`python -m rlhf_lab.instructor.integrity %s --student %s` and grade again",
                      s, a, a, s, exc_info=True)
            raise
        if done:
            log.warning("integrity pre-flight: points withheld for review in %d cell(s) of %s/%s",
                        len(done), s, a)


def hooks(root, db_url: str) -> PreflightHooks:
    """The hooks ``nbgrader_config.py`` installs (``pre`` and ``post`` of one instance)."""
    return PreflightHooks(root, db_url)
