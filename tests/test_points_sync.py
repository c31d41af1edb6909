"""source/ and the gradebook disagree about a test's points: every autograde says so (grader/points_sync.py).

The gradebook comes from the real ``nbgrader generate_assignment``; the message is checked through the
preprocessor nbgrader_config.py installs and, in the slow test, in the output of a real ``nbgrader autograde``.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import nbformat
import pytest

from course_support import REPO, fresh_course, own_db, session_base
from rlhf_lab.instructor.classrun import pipeline
from rlhf_lab.instructor.grader import points_sync

pytestmark = pytest.mark.slow  # real nbgrader generate_assignment / autograde runs

A = "a1_ppo_objective"
NB = "01_clipped_objective"


def _first_test_cell(nb):
    return next(c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade"))


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = pipeline.copy_course(tmp_path_factory.mktemp("points") / "course", REPO,
                                include=("nbgrader_config.py", "source"), assignments=[A])
    run = pipeline.run_nbgrader(["generate_assignment", A, "--force"], root, own_db(root))
    assert run.ok, run.output[-2000:]
    return root


@pytest.fixture()
def course(generated, tmp_path):
    """A private copy of the generated course (source/, release/ and its gradebook)."""
    return Path(shutil.copytree(generated, tmp_path / "course", symlinks=True))


def _bump_points(root, by=1):
    path = root / "source" / A / f"{NB}.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = _first_test_cell(nb)
    cell.metadata["nbgrader"]["points"] = cell.metadata["nbgrader"]["points"] + by
    nbformat.write(nb, path)
    return cell.metadata["nbgrader"]["grade_id"], cell.metadata["nbgrader"]["points"]


def _drift_log(root, caplog):
    pp = points_sync.PointsDrift(source_root=str(root / "source"), course_id="rlhf-ppo")
    points_sync.PointsDrift._seen.clear()
    resources = {"nbgrader": {"assignment": A, "notebook": NB, "db_url": own_db(root), "student": "x"}}
    with caplog.at_level(logging.WARNING):
        caplog.clear()
        pp.log = logging.getLogger("points-test")
        pp.preprocess(nbformat.v4.new_notebook(), resources)
    return " ".join(r.getMessage() for r in caplog.records)


def test_agreeing_points_say_nothing(course, caplog):
    assert _drift_log(course, caplog) == ""


def test_changed_points_are_named_with_the_command_that_updates_the_gradebook(course, caplog):
    grade_id, points = _bump_points(course)
    message = _drift_log(course, caplog)
    assert f"{grade_id}: source/ gives {points:g} points, the gradebook {points - 1:g}" in message
    assert f"nbgrader generate_assignment {A} --force" in message
    # and the command it names does update the gradebook: then nothing is said
    run = pipeline.run_nbgrader(["generate_assignment", A, "--force"], course, own_db(course))
    assert run.ok, run.output[-2000:]
    assert _drift_log(course, caplog) == ""


def test_a_cell_removed_from_source_is_named(course, caplog):
    path = course / "source" / A / f"{NB}.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = _first_test_cell(nb)
    cell.metadata["nbgrader"]["grade"] = False
    nbformat.write(nb, path)
    assert "is in the gradebook but no longer in source/" in _drift_log(course, caplog)


def test_bare_nbgrader_autograde_says_so(tmp_path, tmp_path_factory):
    root = fresh_course(tmp_path / "course", session_base(tmp_path_factory))
    sub = root / "submitted" / "ada_correct" / A
    sub.mkdir(parents=True)
    for path in (REPO / "examples" / "submissions" / "ada_correct" / A).glob("*.ipynb"):
        shutil.copy(path, sub / path.name)
    grade_id, points = _bump_points(root)
    run = pipeline.run_nbgrader(["autograde", A, "--student", "ada_correct", "--force"], root, own_db(root))
    assert run.ok, run.output[-3000:]
    assert f"{grade_id}: source/ gives {points:g} points, the gradebook {points - 1:g}" in run.output
