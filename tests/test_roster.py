"""The roster: examples/roster.csv imported with nbgrader's own ``db student import``; names reach
the gradebook (what Formgrader lists) and ``nbgrader export``'s CSV."""
from __future__ import annotations

import csv

import pytest

from course_support import REPO
from rlhf_lab.instructor import pipeline, roster

ROSTER = REPO / "examples" / "roster.csv"


def _rows(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = pipeline.copy_course(tmp_path_factory.mktemp("roster") / "course", REPO, include=("nbgrader_config.py",))
    db = "sqlite:///" + str(root / "gradebook.db")
    roster.import_roster(ROSTER, root, db)
    run = pipeline.run_nbgrader(["db", "assignment", "add", "a1_ppo_objective"], root, db)
    assert run.ok, run.output[-2000:]
    return root, db


def test_roster_names_every_bundled_student_once():
    ids = [r["id"] for r in _rows(ROSTER)]
    bundled = sorted(p.name for p in (REPO / "examples" / "submissions").iterdir() if p.is_dir())
    assert sorted(ids) == bundled
    assert roster.check_roster(ROSTER) == []
    assert all(r["first_name"] and r["last_name"] and r["lms_user_id"].isdigit() for r in _rows(ROSTER))


def test_import_puts_names_in_the_gradebook(imported):
    root, db = imported
    students = roster.gradebook_students(root, db)
    for row in _rows(ROSTER):
        assert students[row["id"]] == (row["first_name"], row["last_name"], row["email"], row["lms_user_id"])
    assert len(students) == len(_rows(ROSTER))


def test_exported_csv_carries_the_names(imported):
    root, db = imported
    out = pipeline.export_csv(root / "grades.csv", root, db)
    rows = {r["student_id"]: r for r in _rows(out)}
    ada = next(r for r in _rows(ROSTER) if r["id"] == "ada_correct")
    assert (rows["ada_correct"]["first_name"], rows["ada_correct"]["last_name"]) == (ada["first_name"], ada["last_name"])
    oli = next(r for r in _rows(ROSTER) if r["id"].startswith("oli_"))
    assert rows[oli["id"]]["last_name"] == oli["last_name"]  # non-ASCII survives the round trip


def test_reimport_updates_instead_of_duplicating(imported, tmp_path):
    root, db = imported
    changed = tmp_path / "roster.csv"
    changed.write_text("id,first_name,last_name\nada_correct,Ada,Okafor-Reyes\n", encoding="utf-8")
    roster.import_roster(changed, root, db)
    students = roster.gradebook_students(root, db)
    assert students["ada_correct"][:2] == ("Ada", "Okafor-Reyes")
    assert len(students) == len(_rows(ROSTER))


def test_bad_rosters_are_refused_with_every_problem_and_its_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,first_name,surname\nada,Ada,O\n,Ben,M\nada,Ada,O\nx+y,X,Y\n", encoding="utf-8")
    problems = roster.check_roster(bad)
    assert any(p.startswith("line 1: unknown column(s) ['surname']") for p in problems), problems
    assert "line 3: empty id" in problems
    assert "line 4: id 'ada' already on line 2" in problems
    assert any(p.startswith("line 5: id 'x+y'") for p in problems)
    with pytest.raises(roster.RosterError, match="cannot be imported"):
        roster.import_roster(bad, tmp_path, "sqlite:///" + str(tmp_path / "never.db"))
    assert not (tmp_path / "never.db").exists()  # nothing imported
    no_id = tmp_path / "noid.csv"
    no_id.write_text("name,email\nAda,a@x\n", encoding="utf-8")
    assert roster.check_roster(no_id)[0].startswith("line 1: the header must name an 'id' column")
    assert roster.check_roster(tmp_path / "missing.csv") == [f"{tmp_path / 'missing.csv'}: no such file"]
    with pytest.raises(TypeError, match="path must be a path"):
        roster.check_roster(42)
