"""Grader's guides (guides/<assignment>.md): generated from source/, committed, kept in sync."""
from __future__ import annotations

import shutil

import nbformat
import pytest

from course_support import REPO
from rlhf_lab.instructor.operations import guide
from rlhf_lab.instructor.classrun import pipeline


def _hand_graded_cells(assignment):
    """(notebook, grade_id, points, source) of every hand-graded cell, read straight from source/."""
    out = []
    for path in sorted((REPO / "source" / assignment).glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            md = cell.metadata.get("nbgrader", {})
            if md.get("task") or (md.get("grade") and md.get("solution")):
                out.append((path.stem, md["grade_id"], float(md["points"]), cell.source))
    return out


def test_committed_guides_are_in_sync_with_source():
    stale = guide.guides_diff(REPO)
    assert not stale, f"guides out of date, run `make guides`: {stale}"


@pytest.mark.parametrize("assignment", pipeline.graded_assignments(REPO))
def test_guide_lists_every_hand_graded_cell_with_points_answer_and_rubric(assignment):
    cells = _hand_graded_cells(assignment)
    text = (REPO / "guides" / f"{assignment}.md").read_text(encoding="utf-8")
    assert cells, f"{assignment} has no hand-graded cell"
    assert f"{len(cells)} hand-graded cells, {sum(p for *_, p, _ in cells):g} points" in text
    for i, (nb, gid, points, source) in enumerate(cells, 1):
        assert f"## {i}. {nb} / `{gid}` ({points:g} points" in text
        # every line of the instructor's solution (rubric and model answer) is in the guide
        for line in source.split("\n"):
            if line.strip() and "### BEGIN" not in line and "### END" not in line:
                assert line.rstrip() in text, (gid, line)
    entries = guide.assignment_entries(REPO, assignment)
    assert [(e.notebook, e.grade_id) for e in entries] == [(nb, gid) for nb, gid, *_ in cells]
    assert all(e.rubric.startswith("**Rubric") for e in entries), [e.grade_id for e in entries if not e.rubric]
    assert all(e.question for e in entries)


def test_split_solution_separates_model_answer_rubric_and_mark_scheme():
    answer, rubric = guide.split_solution(
        "### BEGIN SOLUTION\n**Model answer.** It clips.\n\n**Rubric (2 points).**\n- 1 pt: clip\n### END SOLUTION")
    assert answer == "**Model answer.** It clips." and rubric == "**Rubric (2 points).**\n- 1 pt: clip"
    answer, rubric = guide.split_solution("Write here.\n=== BEGIN MARK SCHEME ===\n- 2 pts: both\n"
                                          "=== END MARK SCHEME ===")
    assert answer == "Write here." and rubric == "- 2 pts: both"
    with pytest.raises(TypeError, match="source must be a string"):
        guide.split_solution(None)


def test_a_changed_rubric_makes_the_guide_stale(tmp_path):
    root = pipeline.copy_course(tmp_path / "c", REPO, include=("nbgrader_config.py", "source"))
    shutil.copytree(REPO / "guides", root / "guides")
    assert guide.guides_diff(root) == []
    a = pipeline.graded_assignments(REPO)[0]
    nb_name, gid, _, _ = _hand_graded_cells(a)[0]
    path = root / "source" / a / f"{nb_name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)
    cell.source = cell.source.replace("### END SOLUTION", "- 1 pt: a new rubric line\n### END SOLUTION")
    nbformat.write(nb, path)
    assert guide.guides_diff(root) == [f"guides/{a}.md"]
    guide.write_guides(root)
    assert guide.guides_diff(root) == [] and "a new rubric line" in (root / "guides" / f"{a}.md").read_text()


def test_a_question_starts_at_its_section_heading():
    """Text of an earlier section (a reveal, an experiment) between two graded cells is not the question."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    def nbg(**kw):
        return {"nbgrader": {"schema_version": 3, "locked": False, "task": False, **kw}}

    nb = new_notebook(cells=[
        new_code_cell("assert True", metadata=nbg(grade=True, solution=False, grade_id="t1", points=1)),
        new_markdown_cell("**Reveal.** the numbers of section 8"),
        new_markdown_cell("## 9. Analysis"),
        new_markdown_cell("**Q1.** Why? (3 points)"),
        new_markdown_cell("### BEGIN SOLUTION\nBecause.\n### END SOLUTION",
                          metadata=nbg(grade=True, solution=True, grade_id="a1", points=3)),
    ])
    [entry] = guide.notebook_entries(nb, "nb")
    assert entry.question == "## 9. Analysis\n\n**Q1.** Why? (3 points)"
