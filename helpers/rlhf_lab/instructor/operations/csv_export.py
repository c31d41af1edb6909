"""``nbgrader export`` with a real CSV writer (``nbgrader_config.py``: ``ExportApp.plugin_class``).

nbgrader's own ``CsvExportPlugin`` joins the fields with ``","`` and writes them as they are, in the
locale's encoding: a student folder named ``doe, jane`` shifts every later column of its row, one
with a newline or a quote adds rows, and a non-ASCII name fails under a C locale. This plugin writes
the same columns, rows and values through :func:`csv.writer` (every field quoted when needed), as
UTF-8, so each (assignment, student) pair is exactly one row whatever the names hold.

The first eleven columns are nbgrader's own, in its order and with its values. Four more make the
file usable by a person and an LMS (:data:`COLUMNS`):

``lms_user_id``
    The student's LMS user id as the roster gave it (nbgrader's ``Student.lms_user_id``, set by
    ``nbgrader db student import`` from the roster's ``lms_user_id`` column; empty when unknown).
``auto_score`` / ``manual_score``
    ``raw_score`` split by who decided it: the points of cells the autograder scored, and of cells
    a person scored (a ``manual_score`` set in Formgrader, or a score withheld by the integrity
    pre-flight), extra credit with its cell. ``auto_score + manual_score == raw_score``.
``pending_manual_points``
    The points of cells graded by hand that nobody has scored yet (``needs_manual_grade`` and no
    ``manual_score``): above 0, ``score`` is incomplete and can still rise by that much.

Assignments without graded cells (``max_score`` 0, the ungraded ``a2b`` and ``a2c``) have no rows.

Every CSV the course writes goes through :func:`writer` (this export, the backup's cell table):
a text field a spreadsheet would run as a formula (it starts with ``=``, ``+``, ``-``, ``@``, a tab, a
carriage return or a line feed, also after leading spaces, or with the full-width forms of those
signs) gets a leading ``'`` (OWASP, "CSV Injection"), so a roster name ``=HYPERLINK(...)`` or a folder
``@SUM(A1)`` opens as text. Numbers the course computed (``int``/``float``, e.g. a score of ``-1.5``)
are written as numbers: the decision is made by type, never by the text.
"""
from __future__ import annotations

import csv

from nbgrader.api import Gradebook, Grade, MissingEntry, SubmittedAssignment, SubmittedNotebook
from nbgrader.plugins.export import ExportPlugin

#: nbgrader's ``CsvExportPlugin`` columns, in its order.
NBGRADER_COLUMNS = ("assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
                    "raw_score", "late_submission_penalty", "score", "max_score")
#: What the course adds after them (see the module docstring).
EXTRA_COLUMNS = ("lms_user_id", "auto_score", "manual_score", "pending_manual_points")
COLUMNS = NBGRADER_COLUMNS + EXTRA_COLUMNS


#: First characters (after leading whitespace) that make Excel, LibreOffice or Google Sheets read
#: a cell as a formula or a command.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def safe_cell(value) -> str:
    """One CSV field as text: ``None`` -> ``""``, numbers as they are, formula-like text as ``'`` + text.

    ``safe_cell("=1+1") == "'=1+1"``, ``safe_cell(" @SUM(A1)") == "' @SUM(A1)"``,
    ``safe_cell(-1.5) == "-1.5"``, ``safe_cell("doe, jane") == "doe, jane"`` (quoting is the writer's).
    """
    if value is None:
        return ""
    if isinstance(value, (bool, int, float)):
        return str(value)
    text = str(value)
    stripped = text.lstrip(" \t\r\n")
    if text[:1] in FORMULA_PREFIXES or stripped[:1] in FORMULA_PREFIXES:
        return "'" + text
    return text


class _SafeWriter:
    """A :func:`csv.writer` whose every field passes through :func:`safe_cell`."""

    def __init__(self, fh, **fmt):
        self._writer = csv.writer(fh, **fmt)

    def writerow(self, row):
        return self._writer.writerow([safe_cell(v) for v in row])

    def writerows(self, rows):
        for row in rows:
            self.writerow(row)


def writer(fh, **fmt) -> _SafeWriter:
    """The course's CSV writer on the open text file ``fh`` (``newline=""``): quoting and formula guard."""
    return _SafeWriter(fh, **fmt)


def cell_totals(gradebook: Gradebook) -> dict:
    """``{submitted assignment id: (auto_score, manual_score, pending_manual_points)}`` in one query.

    A cell's points count as manual when a person set its ``manual_score`` (Formgrader, or the
    integrity pre-flight withholding them), else as auto (``auto_score``; neither set: 0); extra
    credit goes with its cell, as in nbgrader's ``Grade.score``. A cell that needs a manual grade
    and has no ``manual_score`` adds its ``max_score`` to the pending points."""
    query = (gradebook.db.query(SubmittedAssignment.id, Grade.auto_score, Grade.manual_score, Grade.extra_credit,
                                Grade.needs_manual_grade, Grade.max_score)
             .join(SubmittedNotebook, Grade.notebook_id == SubmittedNotebook.id)
             .join(SubmittedAssignment, SubmittedNotebook.assignment_id == SubmittedAssignment.id))
    out: dict = {}
    for sub_id, auto, manual, extra, needs_manual, max_score in query:
        a, m, p = out.get(sub_id, (0.0, 0.0, 0.0))
        if manual is not None:
            m += manual + (extra or 0.0)
        else:
            if auto is not None:  # neither score set: the cell scores 0, extra credit too (nbgrader's rule)
                a += auto + (extra or 0.0)
            if needs_manual:
                p += max_score or 0.0
        out[sub_id] = (a, m, p)
    return out


def graded(assignment) -> bool:
    """Whether an assignment of the gradebook has points to give (``max_score`` above 0)."""
    return bool(assignment.max_score)


class CsvExport(ExportPlugin):
    """nbgrader's CSV export (same columns and values, then :data:`EXTRA_COLUMNS`), written by :func:`writer`."""

    def records(self, gradebook: Gradebook):
        """One dict (keys :data:`COLUMNS`, raw values: ``None``, text, numbers, datetimes) per
        (graded assignment, student), assignments in gradebook order, students in gradebook order."""
        students = {str(s) for s in self.student}
        assignments = {str(a) for a in self.assignment}
        totals = cell_totals(gradebook)
        for assignment in gradebook.assignments:
            if assignments and assignment.name not in assignments:
                continue
            if not graded(assignment):
                continue  # nothing to grade (a2b, a2c): a row of zeros would read as a failed assignment
            for student in gradebook.students:
                if students and student.id not in students:
                    continue
                row = {"assignment": assignment.name, "duedate": assignment.duedate, "student_id": student.id,
                       "last_name": student.last_name, "first_name": student.first_name, "email": student.email,
                       "max_score": assignment.max_score, "lms_user_id": student.lms_user_id}
                try:
                    sub = gradebook.find_submission(assignment.name, student.id)
                except MissingEntry:
                    row.update(timestamp="", raw_score=0.0, late_submission_penalty=0.0, score=0.0,
                               auto_score=0.0, manual_score=0.0, pending_manual_points=0.0)
                else:
                    penalty = sub.late_submission_penalty
                    auto, manual, pending = totals.get(sub.id, (0.0, 0.0, 0.0))
                    row.update(timestamp=sub.timestamp, raw_score=sub.score, late_submission_penalty=penalty,
                               score=max(0.0, sub.score - penalty), auto_score=auto, manual_score=manual,
                               pending_manual_points=pending)
                yield row

    def rows(self, gradebook: Gradebook):
        """One list of raw values per (graded assignment, student), in ``COLUMNS`` order."""
        for row in self.records(gradebook):
            yield [row[k] for k in COLUMNS]

    def export(self, gradebook: Gradebook) -> None:
        dest = self.to or "grades.csv"
        self.log.info("Exporting grades to %s", dest)
        with open(dest, "w", encoding="utf-8", newline="") as fh:
            out = writer(fh)
            out.writerow(COLUMNS)
            out.writerows(self.rows(gradebook))
