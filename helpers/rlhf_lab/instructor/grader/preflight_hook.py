"""The integrity pre-flight inside every ``nbgrader autograde``, through nbgrader's convert hooks.

``nbgrader_config.py`` sets ``c.Autograde.pre_convert_hook`` and ``c.Autograde.post_convert_hook``
to the two methods of one :class:`PreflightHooks`. nbgrader's converter
(``nbgrader.converters.base.BaseConverter.convert_notebooks``) calls them once per student
submission, whoever started the autograde: ``nbgrader autograde`` on the command line,
Formgrader's Autograde button (nbgrader's API, inside the Jupyter server), the course's commands
and the Dask workers. So the same submitted files get the same findings and the same withheld
points on every path.

Per submission ``submitted/<student>/<assignment>/``:

* **before conversion** (:meth:`PreflightHooks.pre`): :func:`rlhf_lab.instructor.grader.integrity.preflight`
  checks that one folder against ``release/<assignment>/`` and moves what must not run (a broken
  notebook, a notebook of the other assignment, a ``numpy.py`` that would shadow NumPy, a symbolic
  link) to ``integrity/quarantine/``. The converter's ``notebooks`` list is the list nbgrader goes
  on to grade, passed by reference: quarantined paths are removed from it *in place*, so nbgrader
  never runs them (it then scores a notebook it cannot find 0, as it does for a missing one). The
  student's findings replace their earlier ones in ``integrity/<assignment>.json`` (the other
  students' are kept; a file lock serialises parallel graders).
* **after conversion** (:meth:`PreflightHooks.post`), once nbgrader's ``SaveAutoGrades`` has
  written the auto scores: :func:`rlhf_lab.instructor.grader.integrity.apply_overrides` withholds the
  points of every cell a blocking finding names (``manual_score = 0``, notebook flagged, reason in
  the comment).

Both steps are idempotent. A second pre-flight of the same folder (the course command runs its
own before it starts nbgrader) finds the quarantined files' records and reports the same findings;
a second override writes the same scores and replaces its own comment.

What a person reads: the pre hook starts the log of each submission with the pre-flight's
findings in sentences (:func:`findings_sentences`: ERROR for a notebook it kept from running,
WARNING for points withheld for review, a notebook that scores 0, or a finding reported for review
such as a library copy); the findings' technical lines follow at INFO. That log is what Formgrader's
Autograde button shows, and nbgrader's API calls an autograde a success unless it raised: under that
API (only there), the post hook raises :class:`PreflightBlocked` once nbgrader has written everything
for a submission in which the pre-flight kept a notebook from running, so the button says "Error"
with the reason. On the command line and in the course's runs nothing is raised (the class goes on).

Failing closed: nbgrader catches every exception a hook raises and only logs it at INFO level,
then grades on. When the pre-flight itself fails, :meth:`PreflightHooks.pre` logs the error and
empties ``notebooks``, so nbgrader stops this submission ("No notebooks found") instead of grading
files nobody checked. A student folder nbgrader cannot address (a name with ``* ? [ ]``) is
stopped the same way.

Planted files (links, FIFOs, sockets, devices, hard links, oversized or sparse files) are never
followed, opened or copied by nbgrader either; ``nbgrader_config.py`` installs, from this module
(:mod:`rlhf_lab.instructor.grader.safe_files` does the checking):

* :meth:`PreflightHooks.feedback_pre` as ``GenerateFeedback``'s ``pre_convert_hook``: before
  ``autograded/<student>/<assignment>/`` is rendered and its extra files copied into
  ``feedback/``, everything planted there is moved to ``integrity/quarantine/<student>/
  <assignment>/autograded/`` and dropped from the notebooks to render (that student's other
  notebooks get their feedback, and so does the class);
* :func:`planted_file_sweep`, an autograde preprocessor right after execution: whatever the
  kernel left in the student's ``autograded/`` folder that is not a plain file is moved out before
  nbgrader walks that folder to set permissions;
* :func:`install_safe_timestamps`: nbgrader reads ``timestamp.txt`` of a submission with a plain
  ``open`` (before any hook runs), which a FIFO of that name would block forever; the course reads
  it without following a link or blocking;
* :func:`safe_collect_class` and :func:`safe_release_feedback_class`, the exchange's ``collect``
  and ``release_feedback`` (``nbgrader collect``, ``nbgrader release_feedback`` and Formgrader's
  buttons): a submission is copied without following anything (and its owner check warns only
  when another Unix account handed it in, :func:`submission_owner_problem`), and feedback is
  released only from a folder of plain files.

This module imports only the standard library at load time (``nbgrader_config.py`` loads it by its
file path, so nbgrader's start-up never imports JAX); the integrity module is imported on the first
call, in the grading process, which imports the course library for the judge anyway.
"""
from __future__ import annotations

import contextlib
import glob
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
    """:mod:`rlhf_lab.instructor.grader.integrity`, imported by name (this file may be loaded by its path,
    outside the package, so a relative import would not work)."""
    from rlhf_lab.instructor.grader import integrity

    return integrity


def _timeline():
    """:mod:`rlhf_lab.instructor.grader.timeline`, imported by name like :func:`_integrity`."""
    from rlhf_lab.instructor.grader import timeline

    return timeline


def _safe_files():
    """:mod:`rlhf_lab.instructor.grader.safe_files`, imported by name like :func:`_integrity` (one module
    object for the pre-flight and these hooks, so the course roots it knows are the same)."""
    from rlhf_lab.instructor.grader import safe_files

    return safe_files


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


class PreflightBlocked(BaseException):
    """Raised by the post hook, under nbgrader's API only (Formgrader's Autograde button), when the
    pre-flight kept a submitted notebook from running: nbgrader's hooks swallow every ``Exception``,
    and its API reports success unless the autograde raised."""


def report_blocked(why: str) -> None:
    """Append ``why`` (one line) to the file ``$RLHF_BLOCKED_REPORT`` names, when it names one: how a
    Formgrader step run confined in a subprocess (:func:`rlhf_lab.instructor.confine.run_step_confined`)
    learns that the pre-flight kept a notebook from running, so its button says "Error" there too.
    Opened without following a link, never created (the caller made it)."""
    from rlhf_lab.instructor import confine

    path = os.environ.get(confine.BLOCKED_REPORT_ENV)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    except OSError:
        _log().error("could not report to Formgrader that %s", why)
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(why.replace("\n", " ") + "\n")


def _called_by_nbgrader_api() -> bool:
    """Whether this autograde runs inside ``nbgrader.apps.api.NbGraderAPI.autograde`` (Formgrader)."""
    import sys

    try:
        from nbgrader.apps.api import NbGraderAPI
    except Exception:  # noqa: BLE001
        return False
    code = NbGraderAPI.autograde.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _points_text(points: float) -> str:
    return f"{points:g} point{'' if points == 1 else 's'}"


def _place(f) -> str:
    """Where a finding is, for a person: ``01_x.ipynb, cell 6 (ppo_surrogate), line 3``."""
    parts = [f.notebook] if f.notebook else []
    if f.cell is not None:
        parts.append(f"cell {f.cell}" + (f" ({f.grade_id})" if f.grade_id else ""))
    elif f.grade_id:
        parts.append(f.grade_id)
    if f.line is not None:
        parts.append(f"line {f.line}")
    return ", ".join(parts)


def findings_sentences(report, student: str, blocked=(), points=None, ungradable: bool = False) -> list:
    """``[(logging level, sentence)]``: the pre-flight's findings for ``student`` in plain sentences.

    ERROR for what is not graded at all (the submission, or a notebook in ``blocked``, the files the
    pre hook kept from running), WARNING for points withheld for review (how many, from ``points``:
    ``{(notebook file, grade id): points}``; findings that withhold the same cells share a sentence),
    for notebooks that score 0 because they are missing or renamed, and for findings reported for
    review that change no points (a library copy, an edited locked cell nbgrader restored, an extra
    file). Nothing for a clean submission.
    """
    points = points or {}
    a = report.assignment
    if ungradable:
        reasons = "; ".join(dict.fromkeys(f.message for f in report.for_student(student)))
        return [(logging.ERROR, f"pre-flight: {student}/{a} is NOT graded: {reasons}")]

    def total(cells) -> str:
        known = [points[c] for c in cells if c in points]
        return _points_text(sum(known)) if known else f"{len(cells)} cell(s)"

    def said(f) -> str:
        return f"{f.message} [{f.action}]" if f.action else f.message

    errors, zeros, withheld = [], [], {}
    for name in blocked:  # a notebook the pre hook kept from running: every finding about it
        about = [f for f in report.for_student(student) if f.notebook == name]
        cells = [(nb, gid) for f in about for nb, gid in f.withhold] or \
            [k for k, v in points.items() if k[0] == name and v > 0]
        reasons = "; ".join(dict.fromkeys(said(f) for f in about)) or "it was moved out of the submission"
        errors.append((logging.ERROR, f"pre-flight: {name} was NOT graded (not run; {total(list(dict.fromkeys(cells)))} "
                                      f"score 0): {reasons}"))
    for f in report.blocking(student):
        if f.notebook in blocked:
            continue
        cells = tuple(dict.fromkeys(tuple(c) for c in f.withhold))
        if f.code in ("missing-notebook", "renamed-notebook"):
            zeros.append((logging.WARNING, f"pre-flight: {f.message} ({total(cells)})"))
        else:
            withheld.setdefault(cells, []).append(f"{_place(f) or a}: {said(f)}")
    held = []
    for cells, reasons in withheld.items():
        names = ", ".join(f"{gid} ({points[(nb, gid)]:g})" if (nb, gid) in points else gid for nb, gid in cells)
        head = f"pre-flight: {total(cells)} withheld for review ({names}): " if cells else "pre-flight: "
        held.append((logging.WARNING, head + "; ".join(dict.fromkeys(reasons))))
    flagged = [(logging.WARNING, f"pre-flight, for review (no points withheld): {_place(f) or a}: {said(f)}")
               for f in report.warnings(student) if f.notebook not in blocked]
    return errors + held + zeros + flagged


class PreflightHooks:
    """The pre-flight (:meth:`pre`) and its withheld points (:meth:`post`) of one course.

    ``root`` is the course root and ``db_url`` its gradebook, both as ``nbgrader_config.py``
    resolves them. One instance serves every submission of the process (a Jupyter server running
    Formgrader grades many); the report of each submission is kept between its two hooks.
    """

    def __init__(self, root, db_url: str, quarantine: bool = True):
        self.root = Path(root)
        _safe_files().add_course_root(self.root)
        self.db_url = db_url
        self.quarantine = quarantine
        self._reports: dict = {}
        self._blocked: dict = {}  # (assignment, student) -> notebook files the pre hook kept from running

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

            with _timeline().phase("pre-flight", assignment=a):
                report = integrity.preflight(a, self.root, [s], quarantine=self.quarantine, write=False)
            if report.students:
                merge_report(self.root, report)
        except Exception:
            log.error("integrity pre-flight of %s/%s failed; the submission is NOT graded", s, a,
                      exc_info=True)
            notebooks[:] = []
            raise
        ungradable = s in report.ungradable()
        gone = [] if ungradable else [p for p in notebooks if not os.path.isfile(p) or os.path.islink(p)]
        blocked = sorted(os.path.basename(p) for p in gone)
        with _LOCK:
            self._reports[(a, s)] = report
            self._blocked[(a, s)] = blocked
        # first what a person reads (Formgrader's log of this student starts here), then the details
        for level, sentence in findings_sentences(report, s, blocked, self._points(a), ungradable):
            log.log(level, "%s", sentence)
        if ungradable:
            log.info("integrity pre-flight: %s/%s cannot be graded: %s", s, a,
                     "; ".join(f.message for f in report.for_student(s)))
            notebooks[:] = []
            return
        if gone:
            notebooks[:] = [p for p in notebooks if p not in gone]
        for f in report.blocking(s):
            log.info("integrity pre-flight: %s", f.text())
        if gone:
            log.info("integrity pre-flight: not run (quarantined): %s", ", ".join(blocked))

    def _points(self, assignment: str) -> dict:
        """``{(notebook file, grade id): points}`` of the release (empty when it cannot be read)."""
        try:
            specs = _integrity().release_specs(self.root, assignment)
        except Exception:  # noqa: BLE001 - the sentences then name cells without their points
            return {}
        return {(name, c.grade_id): c.points for name, spec in specs.items() for c in spec.cells}

    # -- nbgrader's post_convert_hook ---------------------------------------------------------
    def post(self, assignment=None, student=None, notebooks=None, **_ignored) -> None:
        """Withhold the points of the cells the submission's blocking findings name."""
        log = _log()
        a, s = submission_of(notebooks or [], assignment, student)
        if a is None or s is None:
            return
        with _LOCK:
            report = self._reports.pop((a, s), None)
            blocked = self._blocked.pop((a, s), [])
        try:
            integrity = _integrity()

            if report is None:  # the pre hook did not run for it in this process: check again
                report = integrity.preflight(a, self.root, [s], quarantine=self.quarantine, write=False)
            with _timeline().phase("overrides", assignment=a):
                done = integrity.apply_overrides(report, self.root, self.db_url)
        except Exception:
            log.error("integrity overrides of %s/%s failed: withheld points are NOT applied; run "
                      "`python -m rlhf_lab.instructor.grader.integrity %s --student %s` and grade again",
                      s, a, a, s, exc_info=True)
            raise
        if done:
            points = sum(o.max_score for o in done)
            log.warning("pre-flight: %s withheld for review in %d cell(s) of %s/%s: their manual score is 0 "
                        "and the notebook is flagged until you review them (clearing a manual score in "
                        "Formgrader gives the autograder's score back)", _points_text(points), len(done), s, a)
        if not blocked:
            return
        why = (f"pre-flight: {', '.join(blocked)} of {s}/{a} was NOT graded (it was not run and scores 0); "
               "see the log above for why")
        report_blocked(why)
        if _called_by_nbgrader_api():
            # Formgrader's Autograde button reports "Success" unless the autograde raised: a notebook the
            # pre-flight kept from running is not a success. Raised last, when nbgrader has written
            # everything it writes for this student, so the gradebook is that of every other path.
            raise PreflightBlocked(why)


    # -- GenerateFeedback's pre_convert_hook --------------------------------------------------
    def feedback_pre(self, assignment=None, student=None, notebooks=None, **_ignored) -> None:
        """Move what is planted in ``autograded/<student>/<assignment>/`` out before nbgrader renders it.

        Runs where nbgrader's ``GenerateFeedback`` calls it: after it cleared the old feedback,
        before it copies the folder's extra files into ``feedback/`` and renders each notebook.
        A refused notebook is dropped from ``notebooks`` in place (its page is not written; the
        student's other pages are); a folder that is itself a link is never entered and the
        student gets no feedback from it. Every refusal is logged as an error naming the student
        and the file, and recorded beside the moved file.
        """
        if notebooks is None:
            notebooks = []
        a, s = submission_of(notebooks, assignment, student)
        if a is None or s is None:
            return
        folder = self.root / "autograded" / s / a
        try:
            moved = quarantine_planted(self.root, folder, s, a, "feedback")
        except Exception:
            _log().error("feedback of %s/%s: the check of %s failed; its feedback is NOT written", s, a, folder,
                         exc_info=True)
            notebooks[:] = []
            raise
        if moved is None:  # the folder itself is a link: nothing in it is trusted
            notebooks[:] = []
            return
        keep = [p for p in notebooks if not _moved(p, moved)]
        if len(keep) != len(notebooks):
            notebooks[:] = keep


def _moved(path, moved) -> bool:
    return any(os.path.abspath(path) == os.path.abspath(m) for m in moved)


def _record(root: Path, student: str, assignment: str, rel: str, refusal, action: str, step: str) -> None:
    """A ``.finding.json`` beside the quarantined file, in the integrity report's format."""
    folder = Path(root) / "integrity" / "quarantine" / student / assignment / step
    folder.mkdir(parents=True, exist_ok=True)
    code = {"symbolic link": "symlink", "too large": "oversized-file"}.get(refusal.kind, "special-file")
    data = {"student": student, "assignment": assignment, "notebook": rel, "cell": None, "grade_id": None,
            "line": None, "code": code, "severity": "warn", "message": refusal.message, "withhold": [],
            "action": action}
    name = rel.replace(os.sep, "_") + ".finding.json"
    (folder / name).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8",
                               errors="backslashreplace")


def quarantine_planted(root, folder, student: str, assignment: str, step: str) -> list | None:
    """Move every link, FIFO, socket, device, hard link and oversized file under ``folder`` (a student's
    ``autograded/`` or ``feedback/`` folder) to ``integrity/quarantine/<student>/<assignment>/<step>/``;
    the paths moved, or None when ``folder`` itself is a link or not a folder (then it is moved)."""
    safe = _safe_files()
    root, folder = Path(root), Path(folder)
    dest = root / "integrity" / "quarantine" / student / assignment / step
    for path in (folder.parent, folder):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return []
        if not os.path.isdir(path) or os.path.islink(path):
            found = safe.refusal(path, kind=safe.kind_of(st), reason=f"is a {safe.kind_of(st)}, not a folder")
            where = safe.move_aside(path, dest / ".folder")
            _log().error("%s: %s", step, found.message)
            _record(root, student, assignment, path.name, found, f"moved to {where}" if where else "removed", step)
            return None
    moved = []
    for found, where in safe.sweep(folder, dest, skip=(".ipynb_checkpoints",)):
        rel = os.path.relpath(found.path, folder)
        _log().error("%s: %s [%s]", step, found.message, f"moved to {where}" if where else "removed")
        _record(root, student, assignment, rel, found, f"moved to {where}" if where else "removed", step)
        moved.append(found.path)
    return moved


def planted_file_sweep(root):
    """The autograde preprocessor class that moves what a kernel planted in ``autograded/`` out.

    nbgrader runs it on each notebook right after execution (its ``resources['metadata']['path']``
    is ``autograded/<student>/<assignment>``); the kernel is gone by then. Links, FIFOs and the
    rest go to ``integrity/quarantine/<student>/<assignment>/autograde/``, so nbgrader's
    permission walk and the feedback never touch them.
    """
    from nbconvert.preprocessors import Preprocessor

    course = Path(root)

    class SweepPlantedFiles(Preprocessor):
        """Move links, FIFOs and other planted files out of the student's autograded folder."""

        def preprocess(self, nb, resources):
            folder = Path((resources.get("metadata") or {}).get("path") or "")
            info = resources.get("nbgrader") or {}
            student, assignment = info.get("student"), info.get("assignment")
            expected = course / "autograded" / str(student) / str(assignment)
            if student and assignment and os.path.abspath(folder) == os.path.abspath(expected):
                quarantine_planted(course, folder, student, assignment, "autograde")
            return nb, resources

    return SweepPlantedFiles


def install_safe_timestamps() -> None:
    """Make nbgrader read every ``timestamp.txt`` without following a link or blocking on a FIFO.

    nbgrader's ``CourseDirectory.get_existing_timestamp`` opens the file with a plain ``open``,
    in ``autograde``, ``generate_feedback`` and ``collect``, before the course's hooks run. The
    replacement reads at most 4 KiB of a regular file (:func:`.safe_files.read_text`); anything
    else is logged as an error naming the student and counts as no timestamp.
    """
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.utils import parse_utc

    if getattr(CourseDirectory.get_existing_timestamp, "_course_safe", False):
        return

    def get_existing_timestamp(self, dest_path):
        """The submission time in ``dest_path/timestamp.txt`` (None without one), read safely."""
        safe = _safe_files()
        path = os.path.join(dest_path, "timestamp.txt")
        if not os.path.lexists(path):
            return None
        try:
            text = safe.read_text(path, 4096).strip()
        except (OSError, UnicodeError) as exc:
            self.log.error("ignoring timestamp.txt: %s", exc)
            return None
        if not text:
            self.log.warning("Empty timestamp file: %s", path)
            return None
        try:
            return parse_utc(text)
        except ValueError:
            self.fail("Invalid timestamp string: {}".format(path))

    get_existing_timestamp._course_safe = True
    CourseDirectory.get_existing_timestamp = get_existing_timestamp


def _exchange_record(coursedir, student: str, refusal) -> None:
    """Record a file ``collect`` refused where the integrity pre-flight reports it."""
    rel = os.path.basename(refusal.path)
    try:
        _record(Path(coursedir.root), student, coursedir.assignment_id, rel, refusal, "not collected", "collect")
    except OSError:
        pass


def safe_collect_class():
    """nbgrader's ``ExchangeCollect`` whose copy never follows a link (``c.ExchangeFactory.collect``).

    A submission whose folder in ``inbound/`` is itself a link is not collected. Inside it, links
    and FIFOs arrive in ``submitted/`` as what they are (a link with the same text, never resolved;
    a new FIFO, never opened), so the integrity pre-flight reports and moves them exactly as it
    does for other submissions; sockets, devices, hard links and oversized files are not copied,
    and each is logged as an error naming the student and the file. A submission over the size
    limit is not collected. The other students are collected as usual.

    The owner check (``CollectApp.check_owner``, on by default) is the course's own
    (:func:`submission_owner_problem`): nbgrader warns "... claims to be submitted by X but is owned
    by Y; cheating attempt?" for every submission whose folder's Unix owner is not named like its
    student, which on this course is every submission made with ``nbgrader submit --student ID``
    from the instructor's account (the demo, the tests, a course on one machine). A folder owned by
    the account that collects was made by that account, never by another student, so it is not
    reported; a folder owned by any other account that is not the student's is reported as a
    warning that says what it means.
    """
    from nbgrader.exchange.default.collect import ExchangeCollect
    from nbgrader.utils import ignore_patterns
    from traitlets import Bool

    class SafeExchangeCollect(ExchangeCollect):
        refuse_foreign_owner = Bool(False, help=(
            "Do not collect a submission whose folder in the exchange belongs to an account that is neither "
            "the student's nor the collecting one (on a hub with one account per student: another student "
            "submitted in this name); it is reported as an error naming the student and the owner. Off: a "
            "warning, and it is collected.")).tag(config=True)
        exchange_time = Bool(False, help=(
            "Take each submission's time from the exchange (the latest status-change time of the folder and "
            "of everything in it, which no account can set back), never from the folder's name or its "
            "timestamp.txt, which the student's own process writes; the collected timestamp.txt says it.")
        ).tag(config=True)

        def init_src(self):
            super().init_src()
            if not (self.exchange_time or (self.refuse_foreign_owner and self.check_owner)):
                return
            # again from every entry: the latest per student must be chosen after the refusals and by
            # the exchange's time, not by the times written in the names
            from nbgrader.utils import parse_utc

            student_id = self.coursedir.student_id or "*"
            pattern = os.path.join(self.inbound_path, f"{student_id}+{self.coursedir.assignment_id}+*")
            chosen: dict = {}
            self._exchange_times = {}
            for path in sorted(glob.glob(pattern)):
                rec = self._path_to_record(path)
                if self.refuse_foreign_owner and self.check_owner:
                    problem = submission_owner_problem(path, rec["username"], refuse=True)
                    if problem:
                        self.log.error("collect: %s", problem)
                        continue
                if self.exchange_time:
                    own = rec["timestamp"]
                    rec["timestamp"] = parse_utc(exchange_time_of(path))
                    self._exchange_times[rec["filename"]] = rec["timestamp"]
                    if own is not None and abs((own - rec["timestamp"]).total_seconds()) > 120:
                        self.log.warning("collect: student %r: the submission %s names the time %s, the exchange "
                                         "received it at %s: the exchange's time is used", rec["username"],
                                         rec["filename"], own, rec["timestamp"])
                best = chosen.get(rec["username"])
                due = self.duedate if self.before_duedate else None
                if best is None or _later_choice(rec, best, due):
                    chosen[rec["username"]] = rec
            self.src_records = list(chosen.values())

        def copy_files(self):
            if not self.check_owner:
                return super().copy_files()
            for rec in self.src_records:
                src = os.path.join(self.inbound_path, rec["filename"])
                problem = submission_owner_problem(src, rec["username"])
                if problem:
                    self.log.warning("collect: %s", problem)
                else:
                    self.log.debug("collect: owner of %s checked", src)
            self.check_owner = False  # nbgrader's own check, done above
            try:
                return super().copy_files()
            finally:
                self.check_owner = True

        def do_copy(self, src, dest, log=None):
            safe = _safe_files()
            student = safe.student_of(src) or "?"
            refused: list = []
            try:
                safe.copy_tree_safely(
                    src, dest, max_total=1000 * self.coursedir.max_dir_size,
                    max_file=1000 * self.coursedir.max_file_size, keep_special=True, refused=refused,
                    ignore=ignore_patterns(exclude=self.coursedir.ignore, include=self.coursedir.include,
                                           max_file_size=self.coursedir.max_file_size, log=self.log))
            except OSError as exc:
                self.log.error("student %r: the submission %s was NOT collected: %s", student, src, exc)
                return
            for found in refused:
                self.log.error("collect: %s", found.message)
                _exchange_record(self.coursedir, student, found)
            when = getattr(self, "_exchange_times", {}).get(os.path.basename(src))
            if when is not None:  # the collected copy says the exchange's time, not the student's
                stamp = os.path.join(dest, "timestamp.txt")
                if os.path.lexists(stamp):
                    os.unlink(stamp)
                with open(stamp, "x", encoding="utf-8") as fh:
                    fh.write(when.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))

    return SafeExchangeCollect


def _later_choice(rec: dict, best: dict, due) -> bool:
    """Does ``rec`` replace ``best`` as a student's submission to collect? The latest wins; with
    ``due`` (``CollectApp.before_duedate``), the latest before the due date wins over any after it."""
    if due is not None:
        rec_in, best_in = rec["timestamp"] <= due, best["timestamp"] <= due
        if rec_in != best_in:
            return rec_in
    return rec["timestamp"] > best["timestamp"]


#: at most this many entries are looked at for a submission's time (nbgrader bounds its size anyway)
MAX_TIME_ENTRIES = 20000


def exchange_time_of(path) -> "datetime.datetime":
    """The time the exchange received the submission folder ``path``: the latest status-change time
    (ctime) of the folder and of every entry in it, links and special files not followed. Unlike a
    name, a ``timestamp.txt`` or a modification time, a ctime cannot be set by the account that
    owns the file (any change, ``utime`` included, moves it to now), so a student can make their
    submission look later, never earlier."""
    import datetime

    latest = os.lstat(path).st_ctime
    seen = 0
    for dirpath, dirnames, filenames in os.walk(path):  # (os.walk does not follow links to folders)
        for name in dirnames + filenames:
            seen += 1
            if seen > MAX_TIME_ENTRIES:
                break
            try:
                latest = max(latest, os.lstat(os.path.join(dirpath, name)).st_ctime)
            except OSError:
                continue
    return datetime.datetime.fromtimestamp(latest, datetime.timezone.utc)


def submission_owner_problem(path, student: str, collector_uid: int | None = None,
                             refuse: bool = False) -> str | None:
    """Why the owner of the exchange submission folder ``path`` of ``student`` needs a look, or None.

    None when the folder (not followed if it is a link) belongs to the Unix account named like the
    student, or to the account that collects (``collector_uid``, default this process's effective
    user): only that account (or root) can create a folder it owns, so such a submission was handed
    in from the course's own account (``nbgrader submit --student``), never by another student.
    Any other owner means another account submitted in the student's name.
    """
    try:
        import pwd
    except ImportError:  # no Unix accounts to compare with (nbgrader skips its check there too)
        return None
    uid = os.lstat(path).st_uid
    me = os.geteuid() if collector_uid is None else collector_uid
    if uid == me:
        return None
    try:
        owner = pwd.getpwuid(uid).pw_name
    except KeyError:
        owner = None
    if owner == student:
        return None
    try:
        collector = pwd.getpwuid(me).pw_name
    except KeyError:
        collector = f"uid {me}"
    named = f"the Unix account {owner!r}" if owner else f"user id {uid}, which has no account on this machine,"
    return (f"the submission {os.path.basename(path)} of student {student!r} was handed in by {named} "
            f"(its folder in the exchange belongs to it), not by the account {student!r} nor by the account "
            f"collecting ({collector!r}): another account submitted in this student's name. "
            + ("It was NOT collected (SafeExchangeCollect.refuse_foreign_owner); the student's own submissions "
               "are collected as usual." if refuse else
               "It is collected as usual; check with the student before grading it (--CollectApp.check_owner=False "
               "turns this check off)."))


def safe_release_feedback_class():
    """nbgrader's ``ExchangeReleaseFeedback`` that releases only plain files (``c.ExchangeFactory.release_feedback``).

    A student's ``feedback/<student>/<assignment>/`` that is a link, or holds anything
    :func:`.safe_files.check_no_links` refuses, is not released (an error names the student and
    the file; the other students' feedback is released). Pages and nbgrader's ``timestamp.txt`` /
    ``submission_secret.txt`` are read with :func:`.safe_files.open_regular`, and each page is
    written into the exchange as a new file renamed into place, never through a planted link.
    """
    import glob
    import pwd

    from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback
    from nbgrader.utils import notebook_hash
    from traitlets import Bool

    class SafeExchangeReleaseFeedback(ExchangeReleaseFeedback):
        private_to_student = Bool(False, help=(
            "Release each page readable by its student's Linux account alone (an ACL entry for the "
            "account named as the student id; nothing for other accounts), not 0644 as nbgrader does: "
            "on a hub with one account per student no classmate reads it, even knowing its name. A "
            "student without an account of that name, or an exchange whose filesystem takes no ACL: "
            "0644, and the log says so.")).tag(config=True)

        def _page_acl(self, student: str):
            """(mode, ACL) of a released page of ``student`` (see ``private_to_student``)."""
            if not self.private_to_student:
                return 0o644, None
            try:
                uid = pwd.getpwnam(student).pw_uid
            except KeyError:
                self.log.warning("release_feedback: no Linux account %r: its feedback is released readable by "
                                 "every account (as nbgrader does)", student)
                return 0o644, None
            return 0o600, _safe_files().posix_acl(6, {uid: 4})

        def copy_files(self):
            safe = _safe_files()
            if os.path.islink(self.dest_path) or not os.path.isdir(self.dest_path):
                self.fail(f"the exchange's feedback folder {self.dest_path} is not a plain folder; nothing released")
            exclude = set(self.coursedir.student_id_exclude.split(",")) if self.coursedir.student_id_exclude else set()
            refused_students: set = set()
            for html_file in sorted(glob.glob(os.path.join(self.src_path, "*.html"))):
                feedback_dir, page = os.path.split(html_file)
                student = safe.student_of(html_file) or "?"
                notebook_id = page[: -len(".html")]
                if student in exclude or student in refused_students:
                    continue
                problems = unsafe_feedback_folder(feedback_dir)
                if problems:
                    refused_students.add(student)
                    for message in problems:
                        self.log.error("release_feedback: NOT released: %s", message)
                    continue
                try:
                    timestamp = safe.read_text(os.path.join(feedback_dir, "timestamp.txt"), 4096)
                    secret = safe.read_text(os.path.join(feedback_dir, "submission_secret.txt"), 4096)
                    data = safe.read_bytes(html_file)
                except OSError as exc:
                    self.log.error("release_feedback: NOT released for student %r: %s", student, exc)
                    continue
                checksum = notebook_hash(secret=secret, notebook_id=notebook_id)
                self.log.info("Releasing feedback for student '%s' on assignment '%s/%s/%s' (%s)", student,
                              self.coursedir.course_id, self.coursedir.assignment_id, notebook_id, timestamp)
                target = os.path.join(self.dest_path, f"{checksum}.html")
                mode, acl = self._page_acl(student)
                try:
                    safe.write_bytes_replacing(target, data, mode, acl=acl)
                except OSError as exc:
                    if acl is None:
                        raise
                    self.log.warning("release_feedback: the exchange takes no ACL (%s): feedback of %r released "
                                     "readable by every account", exc.strerror, student)
                    safe.write_bytes_replacing(target, data, 0o644)
                self.log.info("Feedback released to: %s", target)

    return SafeExchangeReleaseFeedback


def unsafe_feedback_folder(folder) -> list[str]:
    """Why a student's feedback folder must not be released (messages naming the student and the
    file), or [] when it is a plain folder of plain files (and its student folder is one too)."""
    safe = _safe_files()
    folder = Path(folder)
    for path in (folder.parent, folder):
        if os.path.islink(path) or not os.path.isdir(path):
            kind = safe.kind_of(os.lstat(path)) if os.path.lexists(path) else "missing"
            return [safe.refusal(path, kind=kind, reason=f"is a {kind}, not a folder").message]
    return [r.message for r in safe.check_no_links(folder)]


def hooks(root, db_url: str) -> PreflightHooks:
    """The hooks ``nbgrader_config.py`` installs (``pre`` and ``post`` of one instance)."""
    return PreflightHooks(root, db_url)
