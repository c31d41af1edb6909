"""Say so when ``source/`` and the gradebook disagree about a graded cell's points.

nbgrader grades with the points the gradebook recorded when ``nbgrader generate_assignment`` last
ran on the course (its grade cells' ``max_score``), not with what ``source/`` says now. An
instructor who changes a test's points in ``source/`` (or adds or removes a graded cell) after the
gradebook knows the assignment would get grades out of the old points without a word.
:class:`PointsDrift` is the first step of every autograde (``nbgrader autograde``, Formgrader's
button, the course command, Dask workers: all read ``nbgrader_config.py``): it compares the
notebook's graded cells in ``source/<assignment>/<notebook>.ipynb`` with the gradebook's and logs one
warning per notebook and process naming every difference and the command that updates the
gradebook. It changes nothing and never fails a grade.

Standard library, nbformat and nbgrader only (``nbgrader_config.py`` loads this file by its path).
"""
from __future__ import annotations

import os

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode


def source_points(path: str) -> dict[str, float]:
    """``{grade_id: points}`` of the graded cells (tests, written answers, tasks) of a source notebook."""
    nb = nbformat.read(path, as_version=4)
    out = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
        if meta.get("grade") or meta.get("task"):
            out[str(meta.get("grade_id"))] = float(meta.get("points", 0) or 0)
    return out


def gradebook_points(db_url: str, assignment: str, notebook: str, course_id: str | None = None) -> dict[str, float]:
    """``{grade_id: max_score}`` the gradebook holds for one notebook ({} when it does not know it)."""
    kwargs = {"course_id": course_id} if course_id else {}
    with Gradebook(db_url, **kwargs) as gb:
        try:
            nb = gb.find_notebook(notebook, assignment)
        except MissingEntry:
            return {}
        cells = {c.name: float(c.max_score or 0) for c in nb.grade_cells}
        cells.update({c.name: float(c.max_score or 0) for c in getattr(nb, "task_cells", [])})
        return cells


def differences(source: dict[str, float], gradebook: dict[str, float]) -> list[str]:
    """Readable differences, one per cell: changed points, cells only in source/, cells only in the gradebook."""
    out = []
    for name in sorted(set(source) | set(gradebook)):
        if name not in gradebook:
            out.append(f"{name} ({source[name]:g} points) is in source/ but not in the gradebook")
        elif name not in source:
            out.append(f"{name} ({gradebook[name]:g} points) is in the gradebook but no longer in source/")
        elif abs(source[name] - gradebook[name]) > 1e-9:
            out.append(f"{name}: source/ gives {source[name]:g} points, the gradebook {gradebook[name]:g}")
    return out


def drift_message(assignment: str, notebook: str, diffs: list[str]) -> str:
    return (f"{assignment}/{notebook}.ipynb: source/ and the gradebook disagree about points, and grades use the "
            f"gradebook's: " + "; ".join(diffs) + f". To grade with source/'s points, run "
            f"`nbgrader generate_assignment {assignment} --force` from the course root (it updates the gradebook "
            f"and release/), then autograde again (`--force`).")


class PointsDrift(NbGraderPreprocessor):
    """Warn (once per notebook and process) when source/'s graded cells differ from the gradebook's."""

    source_root = Unicode("", help="The course's source/ folder").tag(config=True)
    course_id = Unicode("", help="The course id of the gradebook (CourseDirectory.course_id)").tag(config=True)
    _seen: set = set()

    def preprocess(self, nb, resources):
        info = resources.get("nbgrader", {})
        assignment, notebook, db_url = info.get("assignment"), info.get("notebook"), info.get("db_url")
        key = (db_url, assignment, notebook)
        if not (self.source_root and assignment and notebook and db_url) or key in PointsDrift._seen:
            return nb, resources
        PointsDrift._seen.add(key)
        path = os.path.join(self.source_root, assignment, f"{notebook}.ipynb")
        if not os.path.isfile(path):
            return nb, resources
        try:
            have = gradebook_points(db_url, assignment, notebook, self.course_id or None)
            diffs = differences(source_points(path), have) if have else []
        except Exception as exc:  # noqa: BLE001 - a check that cannot run must not stop grading
            self.log.warning("Could not compare %s with the gradebook's points: %s", path, exc)
            return nb, resources
        if diffs:
            self.log.warning(drift_message(assignment, notebook, diffs))
        return nb, resources
