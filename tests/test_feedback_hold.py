"""Feedback while written answers still wait for a human grader: held back by default, and where
generated anyway it says "awaiting grading" instead of a score of 0."""
from __future__ import annotations

import os
import re

import nbformat
import pytest

from course_support import REPO, course_template_dir, fresh_course, own_db, session_base  # noqa: F401
from rlhf_lab.instructor.operations import exchange
from rlhf_lab.instructor.classrun import pipeline
from rlhf_lab.instructor.grader.feedback_filter import AWAITING, float_filter, is_awaiting, round_filter

A = "a1_ppo_objective"
_FORMGRADER = os.path.join(os.path.dirname(__import__("nbgrader").__file__), "server_extensions", "formgrader")
NBGRADER_TEMPLATES = os.path.join(_FORMGRADER, "templates")
BOOTSTRAP_CSS = os.path.join(_FORMGRADER, "static", "node_modules", "bootstrap", "dist", "css")


def _render(cells, score, max_score):
    """nbgrader's own feedback template, with the course's two filters, on a small notebook."""
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    cfg = Config()
    cfg.HTMLExporter.template_name = "feedback"
    cfg.HTMLExporter.extra_template_basedirs = [NBGRADER_TEMPLATES]
    cfg.HTMLExporter.extra_template_paths = [BOOTSTRAP_CSS]  # as nbgrader's GenerateFeedback sets them
    cfg.HTMLExporter.filters = {"float": float_filter, "round": round_filter}
    nb = nbformat.v4.new_notebook(cells=cells)
    resources = {"nbgrader": {"notebook": "nb", "score": score, "max_score": max_score, "late_penalty": 0}}
    html, _ = HTMLExporter(config=cfg).from_notebook_node(nb, resources=resources)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def _cell(kind, gid, points, score, solution):
    make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
    cell = make(source=f"answer of {gid}")
    cell.metadata["nbgrader"] = {"grade": True, "solution": solution, "grade_id": gid, "points": points,
                                 "score": score, "locked": False, "schema_version": 3}
    return cell


def test_nbgraders_template_says_awaiting_grading_for_a_pending_answer_and_numbers_elsewhere():
    text = _render([_cell("code", "test_a", 2, 2.0, False), _cell("markdown", "essay", 3, AWAITING, True)],
                   "2.00 (+3 awaiting grading)", 5.0)
    assert "Written response (Score: awaiting grading / 3.0)" in text
    assert "Test cell (Score: 2.0 / 2.0)" in text
    assert "nb (Score: 2.00 (+3 awaiting grading) / 5.0)" in text
    assert "0.0 / 3.0" not in text
    # the filters change nothing for ordinary values (what Formgrader renders with the same config)
    assert float_filter("1.5") == 1.5 and float_filter(None) == 0.0 and round_filter(2.345, 2) == 2.35
    assert is_awaiting(AWAITING) and not is_awaiting(0.0)


# ------------------------------------------------------------ the real course, one graded student
@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """ada_correct's a1_ppo_objective autograded in a fresh course; nothing graded by hand yet."""
    import shutil

    root = fresh_course(tmp_path_factory.mktemp("hold") / "course", session_base(tmp_path_factory))
    db = own_db(root)
    ex = exchange.ensure_exchange(path=root / "exchange")
    exchange.release(A, root, db, ex)
    home = root.parent / "home"
    shutil.copytree(REPO / "examples" / "submissions" / "ada_correct" / A, home / A)
    assert exchange.submit_many(A, {"ada_correct": home}, root, ex) == {"ada_correct": None}
    exchange.collect(A, root, db, ex, check_owner=False)
    run = pipeline.autograde_student(A, "ada_correct", root, db)
    assert run.ok, run.reason + run.log_tail
    return root, db


def _manual(root, db):
    """{notebook: [grade ids]} of ada's cells that wait for a person (from the gradebook)."""
    grades = pipeline.read_grades(root, db)
    out = {}
    for c in grades.by_cell("ada_correct", A).values():
        if c.score is None:
            out.setdefault(c.notebook, []).append(c.grade_id)
    return out


@pytest.mark.slow
def test_feedback_is_held_until_every_written_answer_of_a_notebook_is_graded(graded):
    from nbgrader.api import Gradebook

    root, db = graded
    waiting = _manual(root, db)
    assert sorted(waiting) == pipeline.notebooks(A, REPO, where="release")  # both notebooks have essays
    assert pipeline.feedback(A, root, db) == {}
    assert pipeline.held_feedback(A, root, db) == {"ada_correct": sorted(waiting)}
    # the instructor grades the first notebook's written answers (as Formgrader does)
    first = sorted(waiting)[0]
    with Gradebook(db) as gb:
        for gid in waiting[first]:
            grade = gb.find_grade(gid, first, A, "ada_correct")
            grade.manual_score = grade.max_score
            gb.db.commit()
    files = pipeline.feedback(A, root, db)
    assert [p.stem for p in files["ada_correct"]] == [first]
    assert pipeline.held_feedback(A, root, db) == {"ada_correct": sorted(waiting)[1:]}
    # only what is there goes out through nbgrader's release_feedback
    exchange.ensure_exchange(path=root / "exchange")
    run = exchange.release_feedback(A, root, db, root / "exchange")
    released = sorted((root / "exchange" / pipeline.COURSE_ID / "feedback").rglob("*.html"))
    assert len(released) == 1, run.output[-2000:]  # nbgrader names released files by a hash
    assert f"{A}/{first}'" in run.output
    assert all(f"{A}/{nb}'" not in run.output for nb in sorted(waiting)[1:])


@pytest.mark.slow
def test_the_flag_releases_pending_feedback_that_says_awaiting_grading(graded):
    root, db = graded
    waiting = _manual(root, db)
    files = pipeline.feedback(A, root, db, release_pending=True)
    assert sorted(p.stem for p in files["ada_correct"]) == pipeline.notebooks(A, REPO, where="release")
    pending_nb = next(nb for nb in sorted(waiting))
    html = (root / "feedback" / "ada_correct" / A / f"{pending_nb}.html").read_text(encoding="utf-8")
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    assert text.count("Written response (Score: awaiting grading /") == len(waiting[pending_nb])
    assert "awaiting grading)" in text  # the notebook's heading names the points still pending
    assert not re.search(r"Written response \(Score: 0\.0 /", text)
    with pytest.raises(TypeError, match="release_pending must be True or False"):
        pipeline.feedback(A, root, db, release_pending="yes")


def test_give_feedback_names_a_wrong_assignment_or_flag():
    from rlhf_lab.instructor.operations import give_feedback

    with pytest.raises(ValueError, match="assignment must be one of"):
        give_feedback.give_feedback("ppo_typo", REPO)
    with pytest.raises(TypeError, match="release must be True or False"):
        give_feedback.give_feedback(A, REPO, release="no")
    assert give_feedback.main(["ppo_typo"]) == 2
