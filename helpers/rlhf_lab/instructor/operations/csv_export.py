"""``nbgrader export`` with a real CSV writer (``nbgrader_config.py``: ``ExportApp.plugin_class``).

nbgrader's own ``CsvExportPlugin`` joins the fields with ``","`` and writes them as they are, in the
locale's encoding: a student folder named ``doe, jane`` shifts every later column of its row, one
with a newline or a quote adds rows, and a non-ASCII name fails under a C locale. This plugin writes
the same columns, rows and values through :func:`csv.writer` (every field quoted when needed), as
UTF-8, so each (assignment, student) pair is exactly one row whatever the names hold.

Every CSV the course writes goes through :func:`writer` (this export, the backup's cell table):
a text field a spreadsheet would run as a formula (it starts with ``=``, ``+``, ``-``, ``@``, a tab, a
carriage return or a line feed, also after leading spaces, or with the full-width forms of those
signs) gets a leading ``'`` (OWASP, "CSV Injection"), so a roster name ``=HYPERLINK(...)`` or a folder
``@SUM(A1)`` opens as text. Numbers the course computed (``int``/``float``, e.g. a score of ``-1.5``)
are written as numbers: the decision is made by type, never by the text.
"""
from __future__ import annotations

import csv

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins.export import ExportPlugin

COLUMNS = ("assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
           "raw_score", "late_submission_penalty", "score", "max_score")


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


class CsvExport(ExportPlugin):
    """nbgrader's CSV export (same columns and values), written by :func:`writer`."""

    def rows(self, gradebook: Gradebook):
        """One list of raw values (``None``, text, numbers, datetimes) per (assignment, student), in ``COLUMNS`` order."""
        students = {str(s) for s in self.student}
        assignments = {str(a) for a in self.assignment}
        for assignment in gradebook.assignments:
            if assignments and assignment.name not in assignments:
                continue
            for student in gradebook.students:
                if students and student.id not in students:
                    continue
                row = {"assignment": assignment.name, "duedate": assignment.duedate, "student_id": student.id,
                       "last_name": student.last_name, "first_name": student.first_name, "email": student.email,
                       "max_score": assignment.max_score}
                try:
                    sub = gradebook.find_submission(assignment.name, student.id)
                except MissingEntry:
                    row.update(timestamp="", raw_score=0.0, late_submission_penalty=0.0, score=0.0)
                else:
                    penalty = sub.late_submission_penalty
                    row.update(timestamp=sub.timestamp, raw_score=sub.score, late_submission_penalty=penalty,
                               score=max(0.0, sub.score - penalty))
                yield [row[k] for k in COLUMNS]

    def export(self, gradebook: Gradebook) -> None:
        dest = self.to or "grades.csv"
        self.log.info("Exporting grades to %s", dest)
        with open(dest, "w", encoding="utf-8", newline="") as fh:
            out = writer(fh)
            out.writerow(COLUMNS)
            out.writerows(self.rows(gradebook))
