"""The integrity pre-flight runs inside nbgrader itself (``rlhf_lab/instructor/grader/preflight_hook.py``).

``nbgrader_config.py`` installs the pre-flight as nbgrader's ``pre_convert_hook`` and its withheld
points as the ``post_convert_hook`` of ``Autograde``. These tests check that:

* fast: the config installs both hooks; the pre hook quarantines what must not run and removes it
  from nbgrader's ``notebooks`` list in place; run twice on the same folder (as the course command
  and the nbgrader it starts both do) it gives the same findings, the same list and the same
  ``integrity/<assignment>.json``, and a per-student run keeps the other students' findings;
* slow: a bare ``python -m nbgrader autograde <assignment> --student <s>`` on a copy of the course
  gives, gradebook row by gradebook row, the grades the course command
  (:func:`rlhf_lab.instructor.classrun.pipeline.run_class`) gives for the same files, for a correct control
  and two hostile submissions: a locked read-only cell unlocked (its nbgrader metadata removed),
  edited and moved to the end of the notebook (the tests after its place must be withheld) and a
  second notebook that is not JSON (quarantined: it scores 0, the first notebook is still graded).
  Without the hooks the bare command gives the moved cell's tests their auto scores and drops the
  second student's whole submission. A fourth student, a bundled mistake, loses its tests in both.
  The course command judges every hidden test in its run's judge server
  (:mod:`rlhf_lab.instructor.grader.judge_server`), bare nbgrader in each student's own process: the equal
  gradebooks are also the proof that the server changes no verdict.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from course_support import REPO, correct_submission, fresh_course, mistakes, own_db, replace_cell, write_submissions

from rlhf_lab.instructor.grader import integrity, judge_server
from rlhf_lab.instructor.classrun import pipeline

ASSIGNMENT = "a1_ppo_objective"
NB1 = "01_clipped_objective"
NB2 = "02_kl_penalty_and_review"
MOVED = "show_table"  # a locked given cell of NB1 that the hostile unlocks, edits and moves to the end
CONTROL = "ctl_correct"
HOSTILE = "hx_locked_cell_moved"
BROKEN = "hx_second_notebook_not_json"
STUDENTS = (CONTROL, HOSTILE, BROKEN)  # and the bundled mistake of :func:`_mistake`


def _mistake():
    """``(student id, Mistake)``: the first bundled mistake of :data:`ASSIGNMENT` (a wrong answer)."""
    return next((sid, m) for sid, m in sorted(mistakes().items()) if m.assignment == ASSIGNMENT)


def _gid(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _moved_locked_cell(nb):
    """``nb`` with the locked cell :data:`MOVED` stripped of its nbgrader metadata (so nbgrader no
    longer knows it), edited and moved to the end of the notebook."""
    nb = copy.deepcopy(nb)
    at = next(i for i, c in enumerate(nb.cells) if _gid(c) == MOVED)
    cell = nb.cells.pop(at)
    cell.metadata.pop("nbgrader", None)
    cell.source = "# moved here by the student\n" + cell.source
    nb.cells.append(cell)
    return nb


def withheld_tests(release_nb) -> list:
    """The graded code cells after :data:`MOVED` in the release: the pre-flight's policy withholds
    the tests after a deleted read-only cell (they ran without it)."""
    at = next(i for i, c in enumerate(release_nb.cells) if _gid(c) == MOVED)
    return [_gid(c) for i, c in enumerate(release_nb.cells)
            if i > at and c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]


def _submissions() -> dict:
    good = correct_submission(ASSIGNMENT)
    moved = dict(good)
    moved[NB1] = _moved_locked_cell(good[NB1])
    broken = dict(good)
    broken[NB2] = '{"cells": [ this is not JSON'
    sid, m = _mistake()
    wrong = dict(good)
    wrong[m.notebook] = replace_cell(good[m.notebook], m.grade_id, m.code)
    return {CONTROL: {ASSIGNMENT: good}, HOSTILE: {ASSIGNMENT: moved}, BROKEN: {ASSIGNMENT: broken},
            sid: {ASSIGNMENT: wrong}}


def _config(root: Path):
    from traitlets.config.loader import PyFileConfigLoader

    saved = dict(os.environ)
    try:
        os.environ.update(RLHF_COURSE_ROOT=str(root), RLHF_COURSE_DB=own_db(root))
        return PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    finally:
        os.environ.clear()
        os.environ.update(saved)


# ------------------------------------------------------------------------------------------ fast
def test_config_installs_both_hooks_on_autograde_only():
    cfg = _config(REPO)
    pre, post = cfg.Autograde.pre_convert_hook, cfg.Autograde.post_convert_hook
    assert callable(pre) and callable(post)
    assert pre.__self__ is post.__self__  # one instance: the report of the pre hook reaches the post hook
    assert Path(pre.__self__.root).resolve() == REPO.resolve()
    assert pre.__self__.db_url == own_db(REPO)
    # generate_assignment is not checked; feedback has its own hook (planted links and special files)
    assert "pre_convert_hook" not in cfg.get("BaseConverter", {})
    assert cfg.GenerateFeedback.pre_convert_hook.__self__ is pre.__self__  # the feedback's own pre hook


def _hooks(root: Path):
    cfg = _config(root)
    return cfg.Autograde.pre_convert_hook.__self__


def _notebook_list(root: Path, student: str) -> list:
    return sorted(str(p) for p in (root / "submitted" / student / ASSIGNMENT).glob("*.ipynb"))


def test_pre_hook_quarantines_in_place_and_is_idempotent(tmp_path):
    root = tmp_path / "course"
    root.mkdir()
    for name in ("nbgrader_config.py", "release"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, root / name)
    write_submissions(root / "submitted", _submissions())
    hooks = _hooks(root)

    # a whole-class pre-flight first (what the course command does), then one student at a time
    integrity.preflight(ASSIGNMENT, root, [CONTROL, HOSTILE, BROKEN])
    whole_class = json.loads((root / "integrity" / f"{ASSIGNMENT}.json").read_text())
    nb2 = str(root / "submitted" / BROKEN / ASSIGNMENT / f"{NB2}.ipynb")
    assert not os.path.exists(nb2)  # quarantined by the whole-class run

    reports, lists = [], []
    for _ in range(2):
        notebooks = _notebook_list(root, BROKEN) + [nb2]  # as nbgrader listed them before the quarantine
        same_object = notebooks
        hooks.pre(assignment=ASSIGNMENT, student=BROKEN, notebooks=notebooks)
        assert notebooks is same_object
        lists.append(list(notebooks))
        reports.append(hooks._reports[(ASSIGNMENT, BROKEN)])
    assert lists[0] == lists[1] == [str(root / "submitted" / BROKEN / ASSIGNMENT / f"{NB1}.ipynb")]
    first, second = ([f.to_dict() for f in r.findings] for r in reports)
    assert first == second
    codes = {f["code"] for f in first if f["severity"] == integrity.BLOCK}
    assert codes == {"invalid-notebook"}
    assert (root / integrity.QUARANTINE / BROKEN / ASSIGNMENT / f"{NB2}.ipynb").exists()

    # the JSON report after per-student runs equals the whole-class one (other students kept)
    for student in (CONTROL, HOSTILE):
        hooks.pre(assignment="*", student="*", notebooks=_notebook_list(root, student))  # ids from the paths
    after = json.loads((root / "integrity" / f"{ASSIGNMENT}.json").read_text())
    assert after == whole_class
    moved_block = [f for f in after["findings"] if f["student"] == HOSTILE and f["severity"] == integrity.BLOCK]
    assert [(f["code"], f["grade_id"]) for f in moved_block] == [("deleted-given", MOVED)]
    assert not [f for f in after["findings"] if f["student"] == CONTROL and f["severity"] == integrity.BLOCK]
    # a correct answer is never reported as a library copy (the course here has no source/: the
    # review reads the release only)
    assert not [f for f in after["findings"] if f["code"] == "library-copy"]


def test_a_blocked_notebook_is_reported_to_the_file_a_confined_formgrader_step_names(tmp_path, monkeypatch):
    """A Formgrader step run confined learns through ``$RLHF_BLOCKED_REPORT`` what the pre-flight kept
    from running: one line per submission appended; a link put at that name is never written through."""
    from rlhf_lab.instructor import confine
    from rlhf_lab.instructor.grader.preflight_hook import report_blocked

    report = tmp_path / "blocked"
    monkeypatch.delenv(confine.BLOCKED_REPORT_ENV, raising=False)
    report_blocked("nothing is reported without the variable")
    report.write_text("")
    monkeypatch.setenv(confine.BLOCKED_REPORT_ENV, str(report))
    report_blocked("pre-flight: 02.ipynb of ada/a1 was NOT graded")
    report_blocked("pre-flight: 01.ipynb of\nben/a1 was NOT graded")
    assert report.read_text().splitlines() == ["pre-flight: 02.ipynb of ada/a1 was NOT graded",
                                               "pre-flight: 01.ipynb of ben/a1 was NOT graded"]
    target = tmp_path / "elsewhere"
    target.write_text("kept\n")
    report.unlink()
    report.symlink_to(target)
    report_blocked("pre-flight: 02.ipynb of zed/a1 was NOT graded")
    assert target.read_text() == "kept\n"


def test_pre_hook_fails_closed(tmp_path):
    """A pre-flight that cannot run leaves nbgrader nothing to grade (nbgrader only logs hook errors)."""
    root = tmp_path / "course"
    (root / "submitted" / CONTROL / ASSIGNMENT).mkdir(parents=True)  # no release/: the pre-flight fails
    nb = root / "submitted" / CONTROL / ASSIGNMENT / f"{NB1}.ipynb"
    nb.write_text("{}")
    from rlhf_lab.instructor.grader.preflight_hook import PreflightHooks

    notebooks = [str(nb)]
    with pytest.raises(Exception):
        PreflightHooks(root, "sqlite:///" + str(root / "gradebook.db")).pre(
            assignment=ASSIGNMENT, student=CONTROL, notebooks=notebooks)
    assert notebooks == []


# ------------------------------------------------------------------------------------------ slow
def gradebook_rows(db_url: str, assignment: str) -> dict:
    """Every grade row, flag and course comment of ``assignment``, straight from the gradebook."""
    from nbgrader.api import Gradebook

    rows = {}
    with Gradebook(db_url, pipeline.COURSE_ID) as gb:
        for sub in gb.find_assignment(assignment).submissions:
            for snb in sub.notebooks:
                rows[(sub.student.id, snb.name, "<flagged>")] = bool(snb.flagged)
                for g in snb.grades:
                    rows[(sub.student.id, snb.name, g.name)] = (
                        g.auto_score, g.manual_score, float(g.max_score), bool(g.needs_manual_grade))
                for cm in snb.comments:
                    text = cm.manual_comment or ""
                    if integrity.COMMENT_TAG in text:
                        rows[(sub.student.id, snb.name, "<comment>", cm.name)] = text
    return rows


def bare_autograde(root: Path, student: str) -> subprocess.CompletedProcess:
    """``python -m nbgrader autograde ASSIGNMENT --student STUDENT --force`` in the course copy."""
    return subprocess.run([sys.executable, "-m", "nbgrader", "autograde", ASSIGNMENT, "--student", student,
                           "--force"], cwd=root, env=pipeline.nbgrader_env(root, own_db(root)),
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def course_command_rows(tmp_path_factory):
    """The course command on the four submissions: its gradebook rows and its judge server's counts."""
    base = tmp_path_factory.getbasetemp()
    root = fresh_course(tmp_path_factory.mktemp("cmd") / "course", base)
    folder = write_submissions(root / "custom_submissions", _submissions())
    judge_server.LAST.clear()
    run = pipeline.run_class(folder, root=root, db_url=own_db(root), names=[ASSIGNMENT], fresh=False,
                             regenerate=False)
    assert all(r.ok for r in run.runs), [(r.student, r.reason, r.log_tail[-2000:]) for r in run.runs]
    return root, run, gradebook_rows(own_db(root), ASSIGNMENT), dict(judge_server.LAST)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_bare_nbgrader_autograde_gives_the_course_commands_grades(course_command_rows, tmp_path_factory):
    cmd_root, cmd_run, expected, served = course_command_rows
    base = tmp_path_factory.getbasetemp()
    root = fresh_course(tmp_path_factory.mktemp("bare") / "course", base)
    subs = _submissions()
    write_submissions(root / "submitted", subs)
    for student in subs:
        proc = bare_autograde(root, student)
        assert proc.returncode == 0, (student, proc.stdout[-3000:], proc.stderr[-3000:])
        # a first autograde of each student, as Formgrader's button runs it: no library warnings
        assert "Warning" not in proc.stderr, (student, proc.stderr[-3000:])
    got = gradebook_rows(own_db(root), ASSIGNMENT)

    # expectations written from the design, not read from the code under test
    release = {name: nbformat.read(cmd_root / "release" / ASSIGNMENT / f"{name}.ipynb", as_version=4)
               for name in (NB1, NB2)}
    graded_tests = {name: [_gid(c) for c in nb.cells
                           if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"]
                    for name, nb in release.items()}
    assert graded_tests[NB1] and graded_tests[NB2]
    for rows in (expected, got):
        for name in (NB1, NB2):
            for gid in graded_tests[name]:
                auto, manual, max_score, _ = rows[(CONTROL, name, gid)]
                assert auto == max_score and manual is None, (CONTROL, name, gid, rows[(CONTROL, name, gid)])
        # the tests after the moved read-only cell are withheld, the one before it keeps its points
        withheld = withheld_tests(release[NB1])
        assert withheld and set(withheld) < set(graded_tests[NB1])
        for gid in graded_tests[NB1]:
            auto, manual, max_score, _ = rows[(HOSTILE, NB1, gid)]
            if gid in withheld:
                assert manual == 0.0, (HOSTILE, gid, rows[(HOSTILE, NB1, gid)])
            else:
                assert auto == max_score and manual is None, (HOSTILE, gid, rows[(HOSTILE, NB1, gid)])
        assert rows[(HOSTILE, NB1, "<flagged>")] is True
        assert rows[(HOSTILE, NB2, "<flagged>")] is False
        for gid in graded_tests[NB2]:
            auto, manual, max_score, _ = rows[(HOSTILE, NB2, gid)]
            assert auto == max_score and manual is None
        # the broken second notebook scores 0; the first is graded in full
        for gid in graded_tests[NB1]:
            auto, manual, max_score, _ = rows[(BROKEN, NB1, gid)]
            assert auto == max_score and manual is None
        for gid in graded_tests[NB2]:
            assert rows[(BROKEN, NB2, gid)][0] == 0 and rows[(BROKEN, NB2, gid)][1] == 0.0
        # the wrong answer loses the tests its recipe says it fails, and only by the autograder
        sid, m = _mistake()
        for gid in m.fails:
            auto, manual, max_score, _ = rows[(sid, m.notebook, gid)]
            assert auto == 0 and manual is None and max_score > 0, (sid, gid, rows[(sid, m.notebook, gid)])
    # the course command judged in its run's server, every hidden test of every student there: no
    # student's process fell back to judging by itself
    hidden = sum(1 for name in (NB1, NB2) for gid in graded_tests[name] if gid.startswith("test_"))
    assert served.get("served", 0) >= hidden * (len(subs) - 1), served  # the broken NB2 runs no tests
    logs = [os.path.join(d, f) for d, _, files in os.walk(cmd_root) for f in files if f.endswith(".log")]
    assert len(logs) >= len(subs)
    assert not [p for p in logs if "judging in this process" in open(p, encoding="utf-8", errors="replace").read()]
    # and cell by cell, flag by flag, comment by comment: the same gradebook
    assert sorted(got) == sorted(expected)
    diff = {k: (expected[k], got[k]) for k in expected if expected[k] != got[k]}
    assert not diff, diff

    # grading again (an instructor pressing Autograde after the course command): nothing changes
    proc = bare_autograde(root, HOSTILE)
    assert proc.returncode == 0, proc.stdout[-3000:]
    again = gradebook_rows(own_db(root), ASSIGNMENT)
    assert again == got
    assert json.loads((root / "integrity" / f"{ASSIGNMENT}.json").read_text()) == \
        json.loads((cmd_root / "integrity" / f"{ASSIGNMENT}.json").read_text().replace(str(cmd_root), str(root)))


def test_a_submission_the_pre_flight_emptied_is_reported_with_what_it_found():
    """nbgrader says only "No notebooks found" when the hook quarantined everything: the reason the
    course reports is the pre-flight's finding, naming the notebook and the problem."""
    from rlhf_lab.instructor.classrun import orchestrator

    output = ("[AutogradeApp | WARNING] integrity pre-flight: zz/a1: nb.ipynb is not valid JSON (line 1)\n"
              "[AutogradeApp | WARNING] integrity pre-flight: not run (quarantined): nb.ipynb\n"
              "[AutogradeApp | ERROR] No notebooks found, did you forget to run 'generate_assignment'?\n")
    reason = orchestrator.known_reason(output)
    assert reason == "nothing left to grade after the integrity pre-flight: zz/a1: nb.ipynb is not valid JSON (line 1)"
    assert orchestrator.known_reason(output.splitlines()[-1]) == "no notebook of the assignment was found in the submission"
