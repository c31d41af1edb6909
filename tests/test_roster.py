"""The roster: examples/roster.csv imported with nbgrader's own ``db student import``; names reach
the gradebook (what Formgrader lists) and ``nbgrader export``'s CSV."""
from __future__ import annotations

import csv

import pytest

from course_support import REPO
from rlhf_lab.instructor.classrun import pipeline
from rlhf_lab.instructor.operations import roster

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
    from nbgrader.api import Gradebook

    with Gradebook(db, pipeline.COURSE_ID) as gb:  # one graded cell (grades.csv leaves out an assignment without points)
        gb.add_notebook("01_clipped_objective", "a1_ppo_objective")
        gb.add_grade_cell("test_ppo_surrogate", "01_clipped_objective", "a1_ppo_objective", max_score=6,
                          cell_type="code")
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
    assert {sid: r["lms_user_id"] for sid, r in rows.items()} == {r["id"]: r["lms_user_id"] for r in _rows(ROSTER)}


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


@pytest.mark.parametrize("sid, why", [
    ("../x", "is a path"), ("..", "is a path"), ("a/b", "is a path"), ("a\\b", "is a path"),
    ("-rf", "starts with '-'"), ("Ada", "upper-case"), ("ada lovelace", "' '"), ("a+b", "'+'"),
    ("=HYPERLINK(1)", "'='"), ("a\tb", "control character"), ("x" * 33, "33 characters"),
    ("1ada", "does not start with a letter"), ("zoë", "'ë'"),
])
def test_an_id_that_a_folder_an_exchange_file_or_a_linux_account_cannot_hold_is_rejected_with_its_line(
        tmp_path, sid, why):
    path = tmp_path / "r.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "first_name"])
        w.writerow(["ok_student", "A"])
        w.writerow([sid, "B"])
    problems = roster.check_roster(path)
    assert len(problems) == 1 and problems[0].startswith(f"line 3: id {sid!r} is not a valid student id"), problems
    assert why in problems[0], problems[0]


def test_the_bundled_rosters_ids_are_valid_and_every_problem_of_a_bad_roster_is_listed(tmp_path):
    assert all(roster.id_problem(r["id"]) is None for r in _rows(ROSTER))
    path = tmp_path / "r.csv"
    path.write_text("id,first_name,last_name,email,lms_user_id\n"
                    "ada,Ada,O,a@x.edu,40101\n"
                    "ADA,Ada,O,b@x.edu,40102\n"          # same id up to case
                    " ben,Ben,M,c@x.edu,40103\n"         # padded
                    "cy,Cy,T,d@x.edu,40101\n"            # Canvas id of line 2 again
                    "dee,\"De\ne\",K,e@x.edu,=1+1\n",     # line break in a name, a formula as the LMS id
                    encoding="utf-8")
    problems = roster.check_roster(path)
    text = "\n".join(problems)
    assert "line 3: id 'ADA' is not a valid student id: it has upper-case letters" in text
    assert "line 3: id 'ADA' already on line 2" in text
    assert "line 4: id ' ben' is not a valid student id: it has spaces around it" in text
    assert "line 5: lms_user_id 40101 already on line 2" in text
    assert "line 6: first_name 'De\\ne' contains a control character" in text
    assert "line 6: lms_user_id '=1+1' is not a number" in text


def test_make_roster_without_a_roster_says_so_and_imports_nothing(tmp_path, monkeypatch, capsys):
    """No roster.csv, no $RLHF_ROSTER, no file named: an error that says where the example roster is,
    not a silent import of the example class."""
    from rlhf_lab.instructor.operations import roster as roster_cli

    course = tmp_path / "course"
    (course / "examples").mkdir(parents=True)
    (course / "examples" / "roster.csv").write_text("id,first_name,last_name,email,lms_user_id\nzed,Z,Q,z@q,1\n")
    monkeypatch.setenv("RLHF_COURSE_ROOT", str(course))
    monkeypatch.delenv("RLHF_ROSTER", raising=False)
    assert roster_cli.main([]) == 2
    err = capsys.readouterr().err
    assert "no roster to import" in err and "ROSTER=examples/roster.csv" in err
    assert not (course / "gradebook.db").exists()
    assert roster_cli.main(["--check", str(course / "examples" / "roster.csv")]) == 0
