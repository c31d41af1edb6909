"""Grader's guides (guides/<assignment>.md): generated from source/, committed, kept in sync.

* Every hand-graded cell has its section with points, question, model answer and rubric, and the
  model answer is never missing.
* Each section and table row names the cell the way Formgrader's grading page shows it: the page
  is rendered here with nbgrader's own ``formgrade`` template and the course's exporter
  configuration (what Formgrader's submission handler does), and the guide is checked against the
  notebook title, the heading or bold label above each answer box and the box's label and points.
"""
from __future__ import annotations

import functools
import re
import shutil

import nbformat
import pytest

from course_support import REPO, course_config
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
        assert re.search(rf"^## {i}\. {re.escape(nb)} · .+$", text, re.M), (i, nb, gid)
        assert f"points; grade_id `{gid}`" in text and f" {points:g} points; grade_id `{gid}`" in text
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


@pytest.mark.parametrize("assignment", pipeline.graded_assignments(REPO))
def test_every_hand_graded_cell_has_a_model_answer_in_its_guide(assignment):
    """A grader needs what a full-marks answer says, not only the rubric: in the source, a
    ``**Model answer.**`` paragraph before the rubric of every hand-graded cell; in the guide, that text."""
    cells = _hand_graded_cells(assignment)
    text = (REPO / "guides" / f"{assignment}.md").read_text(encoding="utf-8")
    sections = text.split('\n<a id="')[1:]
    assert len(sections) == len(cells), (len(sections), len(cells))
    missing = []
    for (nb, gid, _, source), section in zip(cells, sections):
        assert section.startswith(f'{nb}-{gid}"'), section[:80]
        in_guide = section.split("\n### Model answer\n", 1)[1].split("\n### Rubric\n", 1)[0].strip()
        answer, rubric = guide.split_solution(source)
        if not answer.startswith("**Model answer") or in_guide != answer or not rubric:
            missing.append(f"{nb}/{gid}: {in_guide[:40]!r}")
    assert not missing, f"{assignment}: hand-graded cells without a model answer: {missing}"


# ------------------------------------------------------------ the guide names cells as Formgrader does


@functools.lru_cache(maxsize=1)
def _formgrader_exporter():
    """The exporter Formgrader builds: the course's configuration plus its ``formgrade`` template."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config import Config

    cfg = course_config()
    cfg.merge(Config({"HTMLExporter": {"template_name": "formgrade", "extra_template_basedirs": [handlers.template_path]}}))
    return HTMLExporter(config=cfg)


def _formgrader_page(path, assignment: str):
    """Formgrader's grading page of one submitted notebook, with the resources its submission handler passes."""
    from bs4 import BeautifulSoup

    resources = {"assignment_id": assignment, "notebook_id": path.stem, "submission_id": "s1", "index": 0,
                 "total": 1, "base_url": "", "student": "ada_correct", "last_name": "Correct", "first_name": "Ada",
                 "notebook_path": "x"}
    page, _ = _formgrader_exporter().from_filename(str(path), resources=resources)
    return BeautifulSoup(page, "html.parser")


def _what_the_page_shows(soup) -> list[dict]:
    """Every box a person scores on the page, in page order, with what a grader reads there: the
    last heading or bold paragraph label printed above it (since the previous box), the box's label,
    its points text and the grade_id if the page prints one. ``score_id`` (the input's invisible id)
    only ties the box to its cell."""
    boxes, title = [], ""
    for cell in soup.select("#notebook-container div.cell"):
        panel = cell.select_one(".nbgrader_cell")
        if panel is None:
            for el in cell.select(".text_cell_render > *"):
                if re.fullmatch(r"h[1-6]", el.name):
                    for anchor in el.select("a.anchor-link"):
                        anchor.extract()
                    title = el.get_text(" ", strip=True)
                elif el.name == "p":
                    first = next((c for c in el.children if not (isinstance(c, str) and not c.strip())), None)
                    if getattr(first, "name", None) == "strong":
                        title = first.get_text(" ", strip=True).rstrip(".:").strip()
            continue
        heading = panel.select_one(".panel-heading")
        score = heading.select_one("input.score")
        if score is not None and heading.find("code") is None:  # a test cell's box is labelled by its grade_id
            boxes.append({"title": re.sub(r"\s+", " ", title), "score_id": score["id"],
                          "heading": heading.get_text(" ", strip=True),
                          "box": f"{heading.select_one('.nbgrader-label').get_text(strip=True)} "
                                 f"{score.parent.get_text(' ', strip=True)}"})
        title = ""
    return boxes


@pytest.mark.parametrize("assignment", pipeline.graded_assignments(REPO))
def test_guide_names_each_hand_graded_cell_as_formgrader_shows_it(assignment):
    """A grader on Formgrader's page sees the notebook's name, the task's heading above the answer and
    a box labelled "Student's answer" with "/ 3.0"; the box does not print the grade_id of a written
    answer. The guide's section headings and table rows must carry exactly those names."""
    entries = guide.assignment_entries(REPO, assignment)
    text = (REPO / "guides" / f"{assignment}.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \d+\. .*$", text, re.M)
    assert len(headings) == len(entries)
    i = 0
    for nb in dict.fromkeys(e.notebook for e in entries):
        soup = _formgrader_page(REPO / "examples" / "submissions" / "ada_correct" / assignment / f"{nb}.ipynb",
                                assignment)
        assert soup.select_one("h4.panel-title span").get_text(strip=True) == nb
        boxes = _what_the_page_shows(soup)
        ours = [e for e in entries if e.notebook == nb]
        assert [b["score_id"] for b in boxes] == [e.grade_id for e in ours], nb
        for box, e in zip(boxes, ours):
            i += 1
            assert box["title"] and box["box"].startswith(("Student's answer / ", "Student's task / ")), box
            want = f"## {i}. {nb} · {box['title']} · {box['box']}"
            assert headings[i - 1] == want, (headings[i - 1], want)
            anchor = f"#{nb}-{e.grade_id}"
            assert f"| {nb} | [{box['title'].replace('|', chr(92) + '|')}]({anchor}) | {box['box']} |" in text, want
            # the box does not print a written answer's grade_id, so the heading does not offer it as its name
            assert e.grade_id not in box["heading"] and e.grade_id not in headings[i - 1]


def test_screen_title_and_formgrader_box_follow_the_page():
    assert guide.screen_title("## 9. Analysis\n\n**Q1.** Use your plot.") == "Q1"
    assert guide.screen_title("**Reading.** text\n\n### Task 2.7: a `challenge` (4 points)\n\nIs it?") == \
        "Task 2.7: a challenge (4 points)"
    assert guide.screen_title("Why does the *clip* bind here at all, for the positive advantages?") == \
        "Why does the clip bind here at all, …"
    assert guide.screen_title("") == ""
    assert guide.formgrader_box({"grade": True, "solution": True, "points": 3}) == "Student's answer / 3.0"
    assert guide.formgrader_box({"task": True, "points": 1.255}) == "Student's task / 1.25"
    assert guide.formgrader_box({"grade": True, "solution": False, "grade_id": "t", "points": 2}) == "`t` / 2.0"
