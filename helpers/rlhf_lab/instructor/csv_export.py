"""``nbgrader export`` with a real CSV writer (``nbgrader_config.py``: ``ExportApp.plugin_class``).

nbgrader's own ``CsvExportPlugin`` joins the fields with ``","`` and writes them as they are, in the
locale's encoding: a student folder named ``doe, jane`` shifts every later column of its row, one
with a newline or a quote adds rows, and a non-ASCII name fails under a C locale. This plugin writes
the same columns, rows and values through :func:`csv.writer` (every field quoted when needed), as
UTF-8, so each (assignment, student) pair is exactly one row whatever the names hold.
"""
from __future__ import annotations

import csv

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins.export import ExportPlugin

COLUMNS = ("assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
           "raw_score", "late_submission_penalty", "score", "max_score")


def _text(value) -> str:
    return "" if value is None else str(value)


class CsvExport(ExportPlugin):
    """nbgrader's CSV export (same columns and values), written by :mod:`csv`."""

    def rows(self, gradebook: Gradebook):
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
                yield [_text(row[k]) for k in COLUMNS]

    def export(self, gradebook: Gradebook) -> None:
        dest = self.to or "grades.csv"
        self.log.info("Exporting grades to %s", dest)
        with open(dest, "w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(COLUMNS)
            writer.writerows(self.rows(gradebook))
