"""``nbgrader zip_collect`` on LMS downloads: a Canvas zip and a Moodle zip, built here, collected
by the real nbgrader command with the course's collector plugin and roster (rlhf_lab/instructor/operations/lms.py)."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from course_support import REPO
from rlhf_lab.instructor.operations import lms
from rlhf_lab.instructor.classrun import pipeline

A = "a1_ppo_objective"
NOTEBOOKS = pipeline.notebooks(A, REPO, where="release")
ROSTER = ("id,first_name,last_name,email,lms_user_id\n"
          "ada_correct,Ada,Okafor,ada@example.edu,40101\n"
          "ben_unchanged,Ben,Moreau,ben@example.edu,40102\n"
          "oli_noisy,Oli,Søndergaard,oli@example.edu,40115\n")


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = pipeline.copy_course(tmp_path_factory.mktemp("lms") / "course", REPO,
                                include=("nbgrader_config.py", "release"))
    (root / "roster.csv").write_text(ROSTER, encoding="utf-8")
    return root


def _submission(student: str, notebook: str) -> bytes:
    return (REPO / "examples" / "submissions" / student / A / f"{notebook}.ipynb").read_bytes()


def _zip_collect(root: Path, files: dict, name: str):
    """Write ``files`` ({name in zip: bytes}) as the LMS download and run nbgrader zip_collect."""
    archive = root / "downloaded" / A / "archive"
    archive.mkdir(parents=True, exist_ok=True)
    for old in archive.iterdir():
        old.unlink()
    with zipfile.ZipFile(archive / name, "w") as zf:
        for inner, data in files.items():
            zf.writestr(inner, data)
    return pipeline.run_nbgrader(["zip_collect", A, "--force"], root)


def test_canvas_zip_is_collected_per_roster_student_with_late_and_reupload_names(course):
    first, second = NOTEBOOKS
    files = {
        f"okaforada_40101_900001_{first}.ipynb": _submission("ada_correct", first),
        f"okaforada_40101_900001_{second}.ipynb": _submission("ada_correct", second),
        f"moreauben_late_40102_900002_{first}.ipynb": _submission("ben_unchanged", first),
        f"moreauben_late_40102_900002_{second}-1.ipynb": _submission("ben_unchanged", second),  # re-upload
        f"strangerzed_99999_900003_{first}.ipynb": _submission("ada_correct", first),  # not in the roster
    }
    run = _zip_collect(course, files, "submissions.zip")
    assert run.ok, run.output[-3000:]
    sub = course / "submitted"
    for nb in NOTEBOOKS:
        assert (sub / "ada_correct" / A / f"{nb}.ipynb").read_bytes() == _submission("ada_correct", nb)
        assert (sub / "ben_unchanged" / A / f"{nb}.ipynb").read_bytes() == _submission("ben_unchanged", nb)
    assert sorted(p.name for p in sub.iterdir()) == ["ada_correct", "ben_unchanged"]
    assert "Canvas user 99999 (strangerzed) is not in the roster" in run.output


def test_every_upload_of_a_notebook_in_one_download_collects_the_latest_and_reports_the_rest(course):
    """Canvas keeps a student's original and re-uploads (``-1``, ``-2``) in one download, a browser saves
    a second copy as ``(1)``: the highest number is collected, every other upload is named as skipped,
    and the rest of the class is collected too (stock zip_collect stops on "Duplicate submission file")."""
    first, second = NOTEBOOKS
    files = {
        f"okaforada_40101_900001_{first}.ipynb": _submission("ben_unchanged", first),       # original
        f"okaforada_40101_900001_{first}-1.ipynb": _submission("ben_unchanged", first),     # re-upload 1
        f"okaforada_late_40101_900001_{first}-2.ipynb": _submission("ada_correct", first),  # latest, late
        f"okaforada_40101_900001_{second}.ipynb": _submission("ada_correct", second),
        f"moreauben_40102_900002_{first}.ipynb": _submission("ben_unchanged", first),
        f"moreauben_40102_900002_{second}.ipynb": _submission("ada_correct", second),
        f"moreauben_40102_900002_{second} (1).ipynb": _submission("ben_unchanged", second),  # browser copy
    }
    run = _zip_collect(course, files, "submissions.zip")
    assert run.ok, run.output[-3000:]
    assert "Duplicate submission file" not in run.output
    sub = course / "submitted"
    for nb in NOTEBOOKS:
        assert (sub / "ada_correct" / A / f"{nb}.ipynb").read_bytes() == _submission("ada_correct", nb)
        assert (sub / "ben_unchanged" / A / f"{nb}.ipynb").read_bytes() == _submission("ben_unchanged", nb)
    assert not list(sub.rglob("*-1.ipynb")) and not list(sub.rglob("* (1).ipynb"))
    assert f"okaforada_40101_900001_{first}.ipynb: an earlier upload of {first}.ipynb by ada_correct" in run.output
    assert f"okaforada_40101_900001_{first}-1.ipynb: an earlier upload" in run.output
    assert f"moreauben_40102_900002_{second}.ipynb: an earlier upload of {second}.ipynb by ben_unchanged" in run.output


def test_upload_numbers_come_from_the_lms_suffix_of_a_released_name():
    released = {"01_losses.ipynb"}
    assert lms.upload_rank("01_losses.ipynb", released) == ("01_losses.ipynb", 0)
    assert lms.upload_rank("01_losses-3.ipynb", released) == ("01_losses.ipynb", 3)
    assert lms.upload_rank("01_losses (2).ipynb", released) == ("01_losses.ipynb", 2)
    assert lms.upload_rank("01_other (2).ipynb", released) == ("01_other (2).ipynb", 0)
    assert lms.upload_rank("01_losses (2).ipynb", set()) == ("01_losses (2).ipynb", 0)


def test_moodle_zip_in_folders_and_flat_is_collected_by_full_name(course):
    first, second = NOTEBOOKS
    files = {
        f"Ada Okafor_5501_assignsubmission_file_/{first}.ipynb": _submission("ada_correct", first),
        f"Ada Okafor_5501_assignsubmission_file_/{second}.ipynb": _submission("ada_correct", second),
        f"oli  SØNDERGAARD_5515_assignsubmission_file_{first}.ipynb": _submission("oli_noisy_warnings", first),
        f"Nobody Known_5599_assignsubmission_file_/{first}.ipynb": _submission("ada_correct", first),
        "readme_from_moodle.txt": b"not a submission",
    }
    run = _zip_collect(course, files, "moodle.zip")
    assert run.ok, run.output[-3000:]
    sub = course / "submitted"
    for nb in NOTEBOOKS:
        assert (sub / "ada_correct" / A / f"{nb}.ipynb").read_bytes() == _submission("ada_correct", nb)
    assert (sub / "oli_noisy" / A / f"{first}.ipynb").read_bytes() == _submission("oli_noisy_warnings", first)
    assert "Moodle student 'Nobody Known' is not in the roster" in run.output
    assert not (sub / "Nobody Known").exists()


def test_file_names_parse_into_lms_identity_and_notebook():
    # the path is the member's path from the root of the LMS download (the LMS prefix comes first)
    canvas = lms.parse_lms_filename("okaforada_late_40101_77_01_losses-2.ipynb")
    assert canvas == {"lms": "canvas", "lms_name": "okaforada", "late": "late", "lms_user_id": "40101",
                      "submission_id": "77", "file_id": "01_losses-2.ipynb"}
    assert lms.released_name("01_losses-2.ipynb", {"01_losses.ipynb"}) == "01_losses.ipynb"
    assert lms.released_name("a-1.ipynb", {"b.ipynb"}) == "a-1.ipynb"
    folder = lms.parse_lms_filename("/x/Zoë Ångström_12_assignsubmission_file_/sub dir/01_losses.ipynb")
    assert folder is None  # nested folders inside a Moodle submission are not a notebook of the release
    # a name that looks like the LMS's but lies deeper (a folder or archive a student uploaded) is not it
    assert lms.parse_lms_filename("x/extracted/okaforada_late_40101_77_01_losses-2.ipynb") is None
    assert lms.parse_lms_filename("Zed Q_9_assignsubmission_file_/Zoë Ångström_12_assignsubmission_file_/"
                                  "01_losses.ipynb") is None
    flat = lms.parse_lms_filename("Zoë Ångström_12_assignsubmission_file_01_losses.ipynb")
    assert flat["lms"] == "moodle" and flat["full_name"] == "Zoë Ångström" and flat["file_id"] == "01_losses.ipynb"
    assert lms.parse_lms_filename("01_losses.ipynb") is None
    assert lms.normalise_name("  Zoë   ÅNGSTRÖM ") == "zoe angstrom"
    assert lms.canvas_name("Ada", "Okafor") == "okaforada"


def test_two_roster_students_with_one_name_are_not_guessed():
    index = lms.RosterIndex([{"id": "a1", "first_name": "Sam", "last_name": "Lee"},
                             {"id": "a2", "first_name": "Sam", "last_name": "Lee"}])
    sid, why = index.student({"lms": "moodle", "full_name": "Sam Lee"})
    assert sid is None and "two roster students" in why


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="path must be a string"):
        lms.parse_lms_filename(3)
    with pytest.raises(TypeError, match="rows must be a list"):
        lms.RosterIndex("roster.csv")


def _add_assignment(root: Path, duedate: str | None):
    args = ["db", "assignment", "add", A] + ([f"--duedate={duedate}"] if duedate else [])
    run = pipeline.run_nbgrader(args, root)
    assert run.ok, run.output[-2000:]


@pytest.fixture()
def fresh_course(tmp_path):
    root = pipeline.copy_course(tmp_path / "course", REPO, include=("nbgrader_config.py", "release"))
    (root / "roster.csv").write_text(ROSTER, encoding="utf-8")
    return root


def test_a_file_canvas_marks_late_is_collected_as_late(fresh_course):
    """Canvas's ``_late_`` survives collection: the submission's timestamp is after the gradebook's due date
    (Canvas's download does not say when, so 1 second after it), which is what nbgrader reads as late."""
    from nbgrader.utils import parse_utc

    first, second = NOTEBOOKS
    _add_assignment(fresh_course, "2026-11-30 23:59:00 UTC")
    run = _zip_collect(fresh_course, {
        f"okaforada_40101_900001_{first}.ipynb": _submission("ada_correct", first),
        f"moreauben_late_40102_900002_{first}.ipynb": _submission("ben_unchanged", first),
        f"moreauben_40102_900002_{second}.ipynb": _submission("ben_unchanged", second),
    }, "submissions.zip")
    assert run.ok, run.output[-3000:]
    stamp = fresh_course / "submitted" / "ben_unchanged" / A / "timestamp.txt"
    assert parse_utc(stamp.read_text()) == parse_utc("2026-11-30 23:59:01 UTC")
    assert "as LATE (Canvas marks it late" in run.output
    assert not (fresh_course / "submitted" / "ada_correct" / A / "timestamp.txt").exists()


def test_a_late_mark_without_a_due_date_says_how_to_keep_it(fresh_course):
    _add_assignment(fresh_course, None)
    first = NOTEBOOKS[0]
    run = _zip_collect(fresh_course, {f"moreauben_late_40102_900002_{first}.ipynb": _submission("ben_unchanged", first)},
                       "submissions.zip")
    assert run.ok, run.output[-3000:]
    assert "has no due date in the gradebook" in run.output and "--duedate" in run.output
    assert (fresh_course / "submitted" / "ben_unchanged" / A / f"{first}.ipynb").exists()


def test_force_never_deletes_an_exchange_submission_without_a_backup(fresh_course):
    """A submission that came in through the exchange (notebook and timestamp) is copied to backups/
    before ``zip_collect --force`` replaces it, and the instructor is told where."""
    first = NOTEBOOKS[0]
    earlier = fresh_course / "submitted" / "ada_correct" / A
    earlier.mkdir(parents=True)
    (earlier / f"{first}.ipynb").write_bytes(_submission("ben_unchanged", first))
    (earlier / "timestamp.txt").write_text("2026-11-29 10:00:00.000000 UTC")
    (earlier / "link_to_gradebook").symlink_to(fresh_course / "gradebook.db")
    run = _zip_collect(fresh_course, {f"okaforada_40101_900001_{first}.ipynb": _submission("ada_correct", first)},
                       "submissions.zip")
    assert run.ok, run.output[-3000:]
    [backup] = (fresh_course / "backups" / "zip_collect").glob(f"*/ada_correct/{A}")
    assert (backup / f"{first}.ipynb").read_bytes() == _submission("ben_unchanged", first)
    assert (backup / "timestamp.txt").read_text() == "2026-11-29 10:00:00.000000 UTC"
    assert not (backup / "link_to_gradebook").exists() and not (backup / "link_to_gradebook").is_symlink()
    assert f"is backed up in {backup}" in run.output.replace("\n", " ")
    assert (earlier / f"{first}.ipynb").read_bytes() == _submission("ada_correct", first)


def test_real_download_names_of_canvas_and_moodle(fresh_course):
    """The names Canvas and Moodle give in their downloads, beyond one notebook per student: files that are
    not notebooks (a PDF, Moodle's online text), a group member's upload, re-uploads and a late re-upload."""
    first, second = NOTEBOOKS
    run = _zip_collect(fresh_course, {
        f"okaforada_40101_900001_{first}.ipynb": _submission("ada_correct", first),
        f"okaforada_40101_900001_{second}-1.ipynb": _submission("ada_correct", second),
        "okaforada_40101_900001_notes.pdf": b"%PDF-1.4",
        f"moreauben_late_40102_900002_{first}-2.ipynb": _submission("ben_unchanged", first),
        f"moreauben_40102_900002_{first}.ipynb": _submission("ada_correct", first),
    }, "submissions.zip")
    assert run.ok, run.output[-3000:]
    sub = fresh_course / "submitted"
    assert (sub / "ada_correct" / A / f"{second}.ipynb").read_bytes() == _submission("ada_correct", second)
    assert (sub / "ben_unchanged" / A / f"{first}.ipynb").read_bytes() == _submission("ben_unchanged", first)
    assert not list(sub.rglob("*.pdf"))
    run = _zip_collect(fresh_course, {
        f"Ben Moreau_5502_assignsubmission_file_/{first} (1).ipynb": _submission("ben_unchanged", first),
        f"Ben Moreau_5502_assignsubmission_file_/{first}.ipynb": _submission("ada_correct", first),
        "Ben Moreau_5502_assignsubmission_onlinetext_onlinetext.html": b"<p>see notebook</p>",
        f"Ada Okafor_5501_assignsubmission_file_/{second}.ipynb": _submission("ada_correct", second),
    }, "moodle.zip")
    assert run.ok, run.output[-3000:]
    assert (sub / "ben_unchanged" / A / f"{first}.ipynb").read_bytes() == _submission("ben_unchanged", first)
    assert "Invalid submission notebook name" not in run.output
    assert not list(sub.rglob("*.html"))
