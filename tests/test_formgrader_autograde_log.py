"""What Formgrader's Autograde button shows: nbgrader's API result, with the pre-flight's reasons in it.

Formgrader's button posts to nbgrader's ``AutogradeHandler``, which returns
``nbgrader.apps.api.NbGraderAPI.autograde(assignment, student)``: ``success`` (the modal's title,
"Success" or "Error"), ``log`` (the app's log of that run, shown as "Log Output") and, on failure,
``error``. These tests call that API in this process on a real copy of the course (its
``nbgrader_config.py``, so the integrity pre-flight runs as nbgrader's convert hooks, in the
sandbox, with the judge) for submissions the pre-flight blocks, withholds points of or flags:

* a correct submission: success, and not one WARNING or ERROR line in the log (in particular no
  "Attribute 'checksum' for cell ... has changed!" for its untouched test cells);
* a second notebook that is not JSON (quarantined, never run): NOT success, the log starts with an
  ERROR sentence naming the notebook and why, the first notebook is still graded in full;
* ``examples/hostile/h30_rebind_judge`` (points withheld for review): success, and the first
  WARNING line says how many points are withheld, for which cells and why;
* ``examples/hostile/h49_pasted_library_source`` (a library copy, flagged for review): success,
  with a WARNING sentence about the copy;
* ``examples/hostile/h01_test_edited_to_pass`` (a locked test really edited): nbgrader's checksum
  warning for exactly that cell, and for no other.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from course_support import REPO, fresh_course, own_db, session_base, write_submissions
from fixtures import hostile, submissions

A = "a1_ppo_objective"
NB1, NB2 = "01_clipped_objective", "02_kl_penalty_and_review"
CONTROL = "fg_correct"
BROKEN = "fg_second_notebook_not_json"
WITHHELD, LIBRARY_COPY, EDITED = "h30_rebind_judge", "h49_pasted_library_source", "h01_test_edited_to_pass"
LEVEL = re.compile(r"^\[(WARNING|ERROR)\] ", re.M)


@pytest.fixture(scope="module")
def formgrader(tmp_path_factory):
    """``autograde(student) -> result`` through nbgrader's API on a course copy, and its root."""
    saved = dict(os.environ)
    root = fresh_course(tmp_path_factory.mktemp("formgrader") / "course", session_base(tmp_path_factory))
    good = submissions.correct_submission(A, root)  # from this copy's own release, as its gradebook knows it
    write_submissions(root / "submitted", {CONTROL: {A: good},
                                           BROKEN: {A: dict(good, **{NB2: '{"cells": [ not JSON'})}})
    for student in (WITHHELD, LIBRARY_COPY, EDITED):
        shutil.copytree(REPO / "examples" / "hostile" / student / A, root / "submitted" / student / A)
    try:
        from nbgrader.apps.api import NbGraderAPI
        from nbgrader.coursedir import CourseDirectory
        from traitlets.config.loader import PyFileConfigLoader

        os.environ.update(RLHF_COURSE_ROOT=str(root), RLHF_COURSE_DB=own_db(root))
        cfg = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
        api = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
        results: dict = {}

        def autograde(student):
            if student not in results:
                results[student] = api.autograde(A, student)
            return results[student]

        yield autograde, root
    finally:
        os.environ.clear()
        os.environ.update(saved)


def loud(result) -> list[str]:
    """The WARNING and ERROR lines of the result's log, in order."""
    return [line for line in (result.get("log") or "").splitlines() if LEVEL.match(line)]


def scores(root: Path, student: str, notebook: str) -> dict:
    from nbgrader.api import Gradebook

    with Gradebook(own_db(root), "rlhf-ppo") as gb:
        nb = gb.find_submission_notebook(notebook, A, student)
        return {g.name: (g.auto_score, g.manual_score, g.max_score) for g in nb.grades
                if g.cell_type == "code" and g.name.startswith("test_")}


@pytest.mark.slow
def test_a_correct_submission_is_a_quiet_success(formgrader):
    autograde, root = formgrader
    result = autograde(CONTROL)
    assert result["success"] is True, result.get("error")
    assert "Autograding" in result["log"]  # the log is there, and it is nbgrader's
    assert loud(result) == [], loud(result)  # no "checksum ... has changed!" for untouched test cells
    for notebook in (NB1, NB2):
        graded = scores(root, CONTROL, notebook)
        assert graded and all(auto == top and manual is None for auto, manual, top in graded.values()), graded


@pytest.mark.slow
def test_a_notebook_the_pre_flight_kept_from_running_is_not_a_success_and_the_log_says_why(formgrader):
    autograde, root = formgrader
    result = autograde(BROKEN)
    assert result["success"] is False
    lines = loud(result)
    assert lines[0].startswith(f"[ERROR] pre-flight: {NB2}.ipynb was NOT graded (not run; "), lines
    assert "is not a valid notebook" in lines[0] and "score 0" in lines[0], lines[0]
    log = result["log"]
    assert log.index(lines[0]) < log.index("Creating/updating student")  # before nbgrader's own work
    assert f"{NB2}.ipynb of {BROKEN}/{A} was NOT graded" in result["error"].strip().splitlines()[-1]
    # the rest of the submission was graded as on every other path, and its notebook was kept
    first = scores(root, BROKEN, NB1)
    assert first and all(auto == top for auto, _, top in first.values()), first
    assert all(manual == 0.0 for _, manual, _ in scores(root, BROKEN, NB2).values())
    assert (root / "autograded" / BROKEN / A / f"{NB1}.ipynb").is_file()


@pytest.mark.slow
def test_points_withheld_for_review_are_the_first_thing_the_log_says(formgrader):
    autograde, root = formgrader
    case = next(c for c in hostile.load_cases() if c.student == WITHHELD)
    assert "rebinding" in case.findings and case.zero
    result = autograde(WITHHELD)
    assert result["success"] is True, result.get("error")
    first = loud(result)[0]
    withheld = [gid.split("/")[1] for gid in case.zero if gid.startswith(NB1 + "/")]
    m = re.match(r"\[WARNING\] pre-flight: (\d+) points withheld for review \((.*?)\): (.*)$", first)
    assert m, first
    assert [part.split(" (")[0] for part in m.group(2).split(", ")] == withheld, first
    graded = scores(root, WITHHELD, NB1)
    assert int(m.group(1)) == sum(graded[gid][2] for gid in withheld)
    assert "grading.judge" in m.group(3) and "rewrites" in m.group(3), first
    assert all(graded[gid][1] == 0.0 for gid in withheld)  # and the gradebook says the same


@pytest.mark.slow
def test_a_library_copy_is_reported_to_the_grader(formgrader):
    autograde, _ = formgrader
    case = next(c for c in hostile.load_cases() if c.student == LIBRARY_COPY)
    assert "library-copy" in case.findings
    result = autograde(LIBRARY_COPY)
    assert result["success"] is True, result.get("error")
    copies = [line for line in loud(result) if "for review (no points withheld)" in line]
    assert copies and "is a copy of rlhf_lab." in copies[0], loud(result)


@pytest.mark.slow
def test_a_really_edited_locked_cell_is_still_reported_and_only_that_one(formgrader):
    autograde, _ = formgrader
    result = autograde(EDITED)
    changed = re.findall(r"Attribute 'checksum' for cell (\S+) has changed!", result["log"])
    assert changed == ["test_ppo_surrogate"], changed
