"""Withholding points in the gradebook for the blocking findings (after ``nbgrader autograde``).

For each cell a blocking :class:`.findings.Finding` names: nbgrader's manual-score override
(``manual_score = 0``, the autograder's ``auto_score`` kept), the notebook ``flagged`` and the
reasons in the comment of the notebook's answer cells (shown in the feedback). May import nbgrader
(inside :func:`apply_overrides`), :mod:`rlhf_lab.instructor.course`, :mod:`.findings` and
:mod:`.release`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ...course import COURSE_ID, Course, default_db_url, ensure_venv_on_path
from .findings import COMMENT_TAG, IntegrityReport
from .release import NotebookSpec, course_root_of, release_specs


@dataclasses.dataclass(frozen=True)
class Override:
    student: str
    assignment: str
    notebook: str
    grade_id: str
    auto_score: float | None
    max_score: float
    reason: str


def apply_overrides(report: IntegrityReport, root=None, db_url: str | None = None) -> list[Override]:
    """Withhold the points of every cell a blocking finding names (nbgrader manual-score override).

    For each withheld cell: ``manual_score = 0`` (the autograder's ``auto_score`` is kept), the
    notebook is ``flagged`` for review and the reasons go into the comment of the notebook's answer
    cells (shown in the feedback). A student nbgrader never recorded (every notebook broken) gets a
    submission created so the zero and the reason are in the gradebook and the CSV. Idempotent.
    """
    from nbgrader.api import Gradebook, MissingEntry

    if isinstance(root, Course):
        db_url = db_url or root.db_url
    root = course_root_of(root)
    ensure_venv_on_path()
    db_url = db_url or default_db_url(root)
    done: list[Override] = []
    students = sorted({f.student for f in report.blocking()})
    try:
        specs = release_specs(root, report.assignment)
    except FileNotFoundError:
        specs = {}
    with Gradebook(db_url, COURSE_ID) as gb:
        for student in students:
            withheld = report.withheld(student)
            reasons_all = [f"{f.where()}: {f.message}" for f in report.blocking(student)]
            if student in report.ungradable():
                continue  # nbgrader cannot address the folder; the report is the record
            try:
                gb.find_submission(report.assignment, student)
            except MissingEntry:
                gb.update_or_create_student(student)
                gb.update_or_create_submission(report.assignment, student)
            for nb_file, cells in sorted(withheld.items()):
                nb_name = Path(nb_file).stem
                try:
                    snb = gb.find_submission_notebook(nb_name, report.assignment, student)
                except MissingEntry:
                    continue
                for gid, reasons in sorted(cells.items()):
                    try:
                        grade = gb.find_grade(gid, nb_name, report.assignment, student)
                    except MissingEntry:
                        continue
                    grade.manual_score = 0.0
                    grade.needs_manual_grade = False
                    done.append(Override(student, report.assignment, nb_name, gid, grade.auto_score,
                                         float(grade.max_score), reasons[0]))
                snb.flagged = True
                nb_reasons = [f"{f.where()}: {f.message}" for f in report.blocking(student)
                              if any(w[0] == nb_file for w in f.withhold)] or reasons_all
                text = (f"{COMMENT_TAG} Points withheld for instructor review:\n- "
                        + "\n- ".join(dict.fromkeys(nb_reasons)))
                target = comment_cell(specs.get(nb_file), cells)
                for comment in snb.comments:
                    current = comment.manual_comment or ""
                    if COMMENT_TAG in current:
                        current = current.split(COMMENT_TAG)[0].rstrip()
                    if target is None or comment.name == target:
                        current = (current + "\n\n" if current else "") + text
                    comment.manual_comment = current or None
            gb.db.commit()
    return done


def comment_cell(spec: NotebookSpec | None, withheld: dict) -> str | None:
    """The answer cell whose comment carries the reason: the one just before the first withheld test."""
    if spec is None:
        return None
    answers = [c for c in spec.cells if c.kind in ("answer", "autoanswer", "manual") and c.cell_type == "code"]
    if not answers:
        answers = [c for c in spec.cells if c.kind in ("answer", "autoanswer", "manual")]
    if not answers:
        return None
    first = min((c.index for c in spec.cells if c.grade_id in withheld), default=None)
    before = [c for c in answers if first is None or c.index < first]
    return (before[-1] if before else answers[0]).grade_id
