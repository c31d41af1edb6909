"""nbgrader's ``OverwriteCells`` compared with the cell the student was given, not the instructor's.

Why nbgrader said "Attribute 'checksum' for cell test_x has changed!" for every untouched test
cell (nbgrader issue #1961): ``nbgrader generate_assignment`` stores each locked cell in the
gradebook (``SaveCells``) with its checksum BEFORE ``ClearHiddenTests`` removes the hidden-test
region, then writes the release with the checksum of what is left. When it autogrades, nbgrader's
``OverwriteCells`` compares the checksum of the submitted cell (the released text, hidden tests
absent) with the gradebook's (hidden tests present): they differ for every test cell with a hidden
region, so every student got one warning per test, the same warning a student who really edited
a locked cell gets, and a real edit could not be told from the release.

:class:`OverwriteCells` (same name and configuration as nbgrader's, selected in
``nbgrader_config.py`` in place of nbgrader's in ``Autograde.sanitize_preprocessors``) compares
the submitted text with the gradebook's text as the release shows it: the gradebook cell with its
hidden-test and mark-scheme regions removed the way ``generate_assignment`` removed them (the
course's ``ClearHiddenTests`` / ``ClearMarkScheme`` settings). When they are equal the student did
not touch the cell: its full text (hidden tests included) is put back before nbgrader's own check,
which then finds the checksums equal and says nothing. Any other text is left for nbgrader, which
reports the change and restores the gradebook's text as before. Points, lock and type changes are
nbgrader's checks, unchanged. The notebook that is graded is the same either way.

Standard library, nbformat and nbgrader only (``nbgrader_config.py`` loads this file by its path).
"""
from __future__ import annotations

from nbformat.notebooknode import NotebookNode
from nbgrader.api import MissingEntry
from nbgrader.preprocessors import ClearHiddenTests, ClearMarkScheme
from nbgrader.preprocessors import OverwriteCells as NbgraderOverwriteCells


def released_source(source: str, cell_type: str, grade_id: str, parent=None) -> str:
    """``source`` (a gradebook cell's text) as ``generate_assignment`` released it: hidden-test and
    mark-scheme regions removed with the delimiters the course configures."""
    cell = NotebookNode({"cell_type": cell_type, "source": source, "metadata": NotebookNode(
        {"nbgrader": NotebookNode({"grade_id": grade_id, "grade": True, "solution": False, "locked": True})})})
    ClearHiddenTests(parent=parent)._remove_hidden_test_region(cell)  # the order generate_assignment uses
    ClearMarkScheme(parent=parent)._remove_mark_scheme_region(cell)
    return cell.source


class OverwriteCells(NbgraderOverwriteCells):
    """nbgrader's ``OverwriteCells`` whose checksum check compares a locked cell with its released text."""

    def preprocess_cell(self, cell, resources, cell_index):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", None)
        if grade_id is not None:
            try:
                source_cell = self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id)
            except MissingEntry:
                source_cell = None  # nbgrader's own check says so
            if source_cell is not None and source_cell.locked and cell.source != source_cell.source \
                    and self._as_released(source_cell) == cell.source:
                cell.source = source_cell.source  # untouched: the instructor's full text, hidden tests back
        return super().preprocess_cell(cell, resources, cell_index)

    def _as_released(self, source_cell) -> str | None:
        try:
            return released_source(source_cell.source, source_cell.cell_type, source_cell.name, parent=self)
        except RuntimeError:  # unbalanced delimiters: generate_assignment would have refused it
            return None


__all__ = ["OverwriteCells", "released_source"]
