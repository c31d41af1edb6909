"""Links, FIFOs, hard links and oversized files a student planted are never followed by the grader.

Fast tests run the course's own code on a course copy without nbgrader: the integrity pre-flight
(a linked assignment folder, a hard link, a sparse file), the feedback hook, the course's collect,
the feedback check, the release check and the backup's reading of autograded notebooks.

Slow tests run bare nbgrader (what Formgrader's buttons run) in a course copy, each command in a
subprocess with a time limit, so a hang fails the test instead of stalling it:

* ``nbgrader autograde`` of a class in which one resubmission carries a FIFO named
  ``timestamp.txt`` (nbgrader reads it before any hook) and another a FIFO and a link to
  ``source/``'s notebook: the command finishes, the first student is named in an error and
  skipped, the second is graded with the link and the FIFO moved out, the control is graded;
* ``nbgrader generate_feedback`` with a FIFO notebook and a link to ``source/``'s notebook planted
  in ``autograded/<student>/<assignment>/``: it finishes and no feedback file holds a line of the
  instructor's solutions;
* ``nbgrader release_feedback`` with a link to the grader's guide planted in a feedback folder:
  that student is not released, the others are, and the exchange holds no text of the guide;
* ``nbgrader collect`` of an exchange submission holding a link and a hard link to the gradebook:
  no copy of the gradebook lands in ``submitted/``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from course_support import REPO, correct_submission, fresh_course, own_db, session_base, write_submissions

from rlhf_lab.instructor.operations import backup, exchange
from rlhf_lab.instructor.grader import integrity
from rlhf_lab.instructor.classrun import pipeline

ASSIGNMENT = "a1_ppo_objective"
NB1 = "01_clipped_objective"
#: The notebook the students below do not submit: its solutions can only reach a page through a link.
NB2 = "02_kl_penalty_and_review"
SQLITE_MAGIC = b"SQLite format 3\x00"


def _solution_lines(source_nb: Path) -> list[str]:
    """Distinctive lines between ``BEGIN SOLUTION`` and ``END SOLUTION`` of a source notebook that
    neither the release notebooks nor the submitted notebook (:data:`NB1`, the instructor's own
    answers) show: read directly, not with the code under test."""
    release = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "release" / ASSIGNMENT).glob("*.ipynb"))
    release += (REPO / "source" / ASSIGNMENT / (NB1 + ".ipynb")).read_text(encoding="utf-8")
    out, inside = [], False
    for cell in json.loads(source_nb.read_text(encoding="utf-8"))["cells"]:
        for line in "".join(cell["source"]).split("\n"):
            if "BEGIN SOLUTION" in line:
                inside = True
            elif "END SOLUTION" in line:
                inside = False
            elif inside and len(line.strip()) >= 25 and not line.strip().startswith("#") \
                    and line.strip() not in release:
                out.append(line.strip())
    assert out, "the source notebook has solution lines"
    return out


def _plain_text_under(folder: Path) -> str:
    """All regular files' text under ``folder``, links not followed (``os.walk`` + ``lstat``)."""
    chunks = []
    for dirpath, _, files in os.walk(folder):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink() and p.is_file():
                chunks.append(p.read_bytes().decode("utf-8", "replace"))
    return "\n".join(chunks)


def _tiny_course(tmp_path: Path) -> Path:
    """A course copy without nbgrader runs (``source/``, ``release/``, the config)."""
    return pipeline.copy_course(tmp_path / "course", REPO)


def _submit(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    nb = correct_submission(ASSIGNMENT)[NB1]
    (folder / (NB1 + ".ipynb")).write_text(nbformat.writes(nb), encoding="utf-8")


# ------------------------------------------------------------------------------------ fast: pre-flight
def test_a_linked_assignment_folder_is_never_checked_through_and_the_student_is_not_graded(tmp_path):
    root = _tiny_course(tmp_path)
    (root / "submitted" / "mallory").mkdir(parents=True)
    os.symlink(root / "source" / ASSIGNMENT, root / "submitted" / "mallory" / ASSIGNMENT)
    _submit(root / "submitted" / "honest" / ASSIGNMENT)
    before = sorted(os.listdir(root / "source" / ASSIGNMENT))
    report = integrity.preflight(ASSIGNMENT, root)
    assert report.ungradable() == ["mallory"]
    found = [f for f in report.for_student("mallory") if f.code == "folder-link"]
    assert found and "symbolic link" in found[0].message and "mallory" in found[0].where()
    assert sorted(os.listdir(root / "source" / ASSIGNMENT)) == before  # nothing moved out of source/
    assert not os.path.lexists(root / "submitted" / "mallory" / ASSIGNMENT)
    assert "honest" in report.students and "honest" not in report.ungradable()


def test_a_hard_link_and_a_sparse_file_are_moved_out_never_copied(tmp_path):
    root = _tiny_course(tmp_path)
    folder = root / "submitted" / "mallory" / ASSIGNMENT
    _submit(folder)
    os.link(root / "nbgrader_config.py", folder / "config_copy.py")
    with open(folder / "weights.bin", "wb") as fh:
        fh.truncate(10 * 1024 ** 3)
    report = integrity.preflight(ASSIGNMENT, root, ["mallory"])
    codes = {(f.code, f.notebook): f for f in report.for_student("mallory")}
    assert ("special-file", "config_copy.py") in codes and "hard link" in codes[("special-file", "config_copy.py")].message
    assert ("oversized-file", "weights.bin") in codes
    assert sorted(os.listdir(folder)) == [NB1 + ".ipynb"]
    q = root / integrity.QUARANTINE / "mallory" / ASSIGNMENT
    assert os.stat(q / "weights.bin").st_blocks * 512 < 1024 ** 2  # moved, not densely copied
    assert (root / "nbgrader_config.py").exists()


def test_the_feedback_hook_moves_planted_files_out_and_drops_them_from_what_is_rendered(tmp_path):
    from rlhf_lab.instructor.grader import preflight_hook

    root = _tiny_course(tmp_path)
    folder = root / "autograded" / "mallory" / ASSIGNMENT
    _submit(folder)
    os.mkfifo(folder / "pipe.ipynb")
    os.symlink(root / "source" / ASSIGNMENT / (NB1 + ".ipynb"), folder / "solutions.txt")
    notebooks = sorted(str(p) for p in folder.glob("*.ipynb"))
    hooks = preflight_hook.hooks(root, own_db(root))
    hooks.feedback_pre(assignment=ASSIGNMENT, student="*", notebooks=notebooks)
    assert notebooks == [str(folder / (NB1 + ".ipynb"))]  # changed in place, the real notebook kept
    assert sorted(os.listdir(folder)) == [NB1 + ".ipynb"]
    records = sorted((root / "integrity" / "quarantine" / "mallory" / ASSIGNMENT / "feedback").glob("*.finding.json"))
    messages = [json.loads(r.read_text())["message"] for r in records]
    assert any("'mallory'" in m and "pipe.ipynb" in m and "FIFO" in m for m in messages), messages
    assert any("solutions.txt" in m and "symbolic link" in m for m in messages), messages


def test_a_linked_autograded_folder_gives_no_feedback(tmp_path):
    from rlhf_lab.instructor.grader import preflight_hook

    root = _tiny_course(tmp_path)
    (root / "autograded" / "mallory").mkdir(parents=True)
    os.symlink(root / "source" / ASSIGNMENT, root / "autograded" / "mallory" / ASSIGNMENT)
    notebooks = [str(root / "autograded" / "mallory" / ASSIGNMENT / (NB1 + ".ipynb"))]
    preflight_hook.hooks(root, own_db(root)).feedback_pre(assignment=ASSIGNMENT, student="mallory",
                                                          notebooks=notebooks)
    assert notebooks == [] and (root / "source" / ASSIGNMENT / (NB1 + ".ipynb")).is_file()


# --------------------------------------------------------------------------- fast: collect, feedback, backup
def test_the_course_collect_keeps_links_as_links_and_refuses_hard_links_and_linked_folders(tmp_path):
    root = _tiny_course(tmp_path)
    subs = tmp_path / "subs"
    _submit(subs / "mallory" / ASSIGNMENT)
    os.symlink(root / "nbgrader_config.py", subs / "mallory" / ASSIGNMENT / "notes.txt")
    os.link(root / "nbgrader_config.py", subs / "mallory" / ASSIGNMENT / "copy.py")
    (subs / "trudy").mkdir()
    os.symlink(root / "source" / ASSIGNMENT, subs / "trudy" / ASSIGNMENT)
    _submit(subs / "honest" / ASSIGNMENT)
    got = pipeline.collect(subs, root, [ASSIGNMENT])
    assert sorted(s for s, _ in got.collected) == ["honest", "mallory"]
    dest = root / "submitted" / "mallory" / ASSIGNMENT
    assert (dest / "notes.txt").is_symlink() and not os.path.lexists(dest / "copy.py")
    assert "hard link" in got.problems[("mallory", ASSIGNMENT)] and "'mallory'" in got.problems[("mallory", ASSIGNMENT)]
    assert "symbolic link" in got.problems[("trudy", ASSIGNMENT)]
    assert not os.path.lexists(root / "submitted" / "trudy")


def test_a_feedback_page_that_is_a_fifo_is_not_read_and_not_kept(tmp_path):
    """The hidden-text check of written pages never blocks on a FIFO page (child process, time limit)."""
    root = _tiny_course(tmp_path)
    folder = root / "feedback" / "mallory" / ASSIGNMENT
    folder.mkdir(parents=True)
    os.mkfifo(folder / (NB1 + ".html"))
    code = ("from rlhf_lab.instructor.classrun import pipeline\n"
            f"print(pipeline.check_written_feedback({ASSIGNMENT!r}, {str(root)!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=pipeline.nbgrader_env(root, own_db(root)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mallory" in done.stdout and "FIFO" in done.stdout
    assert not os.path.lexists(folder / (NB1 + ".html"))


def test_feedback_folders_with_links_are_listed_before_release(tmp_path):
    root = _tiny_course(tmp_path)
    for student in ("honest", "mallory"):
        folder = root / "feedback" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / (NB1 + ".html")).write_text("<html>ok</html>")
    os.symlink(REPO / "guides" / (ASSIGNMENT + ".md"), root / "feedback" / "mallory" / ASSIGNMENT / "guide.html")
    bad = exchange.unsafe_feedback(ASSIGNMENT, root)
    assert list(bad) == ["mallory"] and "guide.html" in bad["mallory"][0] and "'mallory'" in bad["mallory"][0]


def test_the_backup_never_reads_an_autograded_notebook_through_a_link(tmp_path):
    root = _tiny_course(tmp_path)
    folder = root / "autograded" / "mallory" / ASSIGNMENT
    folder.mkdir(parents=True)
    os.symlink(root / "source" / ASSIGNMENT / (NB1 + ".ipynb"), folder / (NB1 + ".ipynb"))
    refused: list = []
    index = backup._autograded_index(root, "mallory", ASSIGNMENT, NB1, {}, refused)
    assert index == {} and len(refused) == 1 and "'mallory'" in refused[0] and "symbolic link" in refused[0]


# ------------------------------------------------------------------------------ slow: bare nbgrader
def _nbgrader(root: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    """``python -m nbgrader ARGS`` in the course copy; a hang fails with ``TimeoutExpired``."""
    return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=root,
                          env=pipeline.nbgrader_env(root, own_db(root)), capture_output=True, text=True,
                          timeout=timeout)


def _scores(root: Path) -> dict:
    """``{student: total auto score}`` of :data:`ASSIGNMENT` in the course copy's gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(own_db(root), "rlhf-ppo") as gb:
        return {s.student.id: sum(g.auto_score or 0 for nb in s.notebooks for g in nb.grades)
                for s in gb.find_assignment(ASSIGNMENT).submissions}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A course copy after bare ``nbgrader autograde`` of three students (see the module docstring)."""
    base = session_base(tmp_path_factory)
    root = fresh_course(tmp_path_factory.mktemp("planted") / "course", base)
    nb = correct_submission(ASSIGNMENT)[NB1]
    write_submissions(root / "submitted", {s: {ASSIGNMENT: {NB1: nb}} for s in ("ctl", "fifo_stamp", "linker")})
    sub = root / "submitted"
    for s in ("ctl", "linker"):  # what `nbgrader submit` adds (release_feedback needs both)
        (sub / s / ASSIGNMENT / "timestamp.txt").write_text("2024-01-01 10:00:00.000000 UTC\n")
        (sub / s / ASSIGNMENT / "submission_secret.txt").write_text(f"secret-of-{s}")
    os.mkfifo(sub / "fifo_stamp" / ASSIGNMENT / "timestamp.txt")
    # an earlier grading of fifo_stamp: nbgrader compares the new submission's timestamp.txt with it
    (root / "autograded" / "fifo_stamp" / ASSIGNMENT).mkdir(parents=True)
    (root / "autograded" / "fifo_stamp" / ASSIGNMENT / "timestamp.txt").write_text("2023-01-01 10:00:00.000000 UTC\n")
    os.mkfifo(sub / "linker" / ASSIGNMENT / "pipe")
    os.symlink(root / "source" / ASSIGNMENT / (NB2 + ".ipynb"), sub / "linker" / ASSIGNMENT / "solutions.txt")
    run = _nbgrader(root, "autograde", ASSIGNMENT)  # no --force: nbgrader reads timestamp.txt first
    return root, run


@pytest.mark.slow
def test_bare_autograde_finishes_names_the_student_and_grades_the_class(graded):
    root, run = graded
    log = run.stdout + run.stderr
    assert "'fifo_stamp'" in log and "timestamp.txt" in log and "FIFO" in log, log[-4000:]
    scores = _scores(root)
    assert scores.get("ctl", 0) > 0 and scores.get("linker", 0) > 0, (scores, log[-4000:])
    linker = root / "autograded" / "linker" / ASSIGNMENT
    assert not os.path.lexists(linker / "pipe") and not os.path.lexists(linker / "solutions.txt")
    lines = _solution_lines(root / "source" / ASSIGNMENT / (NB2 + ".ipynb"))
    text = _plain_text_under(linker)
    assert not [line for line in lines if line in text]
    report = json.loads((root / "integrity" / f"{ASSIGNMENT}.json").read_text(encoding="utf-8"))
    codes = {(f["student"], f["code"], f["notebook"]) for f in report["findings"]}
    assert ("linker", "symlink", "solutions.txt") in codes and ("linker", "special-file", "pipe") in codes


@pytest.mark.slow
def test_bare_generate_feedback_finishes_and_shows_no_source_text(graded):
    root, _ = graded
    planted = root / "autograded" / "ctl" / ASSIGNMENT
    os.mkfifo(planted / "pipe.ipynb")
    os.symlink(root / "source" / ASSIGNMENT / (NB2 + ".ipynb"), planted / "solutions.txt")
    run = _nbgrader(root, "generate_feedback", ASSIGNMENT, "--force", timeout=900)
    log = run.stdout + run.stderr
    assert (root / "feedback" / "ctl" / ASSIGNMENT / (NB1 + ".html")).is_file(), log[-4000:]
    assert (root / "feedback" / "linker" / ASSIGNMENT / (NB1 + ".html")).is_file(), log[-4000:]
    assert "'ctl'" in log and "pipe.ipynb" in log
    text = _plain_text_under(root / "feedback")
    leaked = [line for line in _solution_lines(root / "source" / ASSIGNMENT / (NB2 + ".ipynb")) if line in text]
    assert not leaked, leaked[:3]
    assert not [p for p in (root / "feedback").rglob("*") if p.is_symlink() or p.is_fifo()]


@pytest.mark.slow
def test_bare_release_feedback_releases_only_plain_folders(graded):
    root, _ = graded
    if not (root / "feedback" / "ctl" / ASSIGNMENT / (NB1 + ".html")).is_file():
        _nbgrader(root, "generate_feedback", ASSIGNMENT, "--force", timeout=900)
    exchange.ensure_exchange(root, root / "exchange")
    guide = REPO / "guides" / (ASSIGNMENT + ".md")
    os.symlink(guide, root / "feedback" / "linker" / ASSIGNMENT / "guide.html")
    run = _nbgrader(root, "release_feedback", ASSIGNMENT, timeout=300)
    log = run.stdout + run.stderr
    released = root / "exchange" / "rlhf-ppo" / "feedback"
    pages = sorted(released.glob("*.html"))
    assert len(pages) == 1, log[-4000:]  # ctl's one page; none of linker's
    assert "'linker'" in log and "guide.html" in log
    # ctl's notebook is the source's solutions: its own answers (the model answers) belong in its feedback
    answers = "\n".join(c.source for c in nbformat.read(root / "source" / ASSIGNMENT / (NB1 + ".ipynb"), as_version=4).cells)
    guide_lines = [ln.strip() for ln in guide.read_text(encoding="utf-8").splitlines()
                   if len(ln.strip()) > 30 and ln.strip() not in answers]
    assert guide_lines
    text = _plain_text_under(released)
    assert not [ln for ln in guide_lines if ln in text]
    assert not [p for p in pages if p.is_symlink()]


@pytest.mark.slow
def test_bare_collect_never_copies_the_gradebook_through_a_link(tmp_path, tmp_path_factory):
    root = fresh_course(tmp_path / "course", session_base(tmp_path_factory))
    exchange.ensure_exchange(root, root / "exchange")
    inbound = root / "exchange" / "rlhf-ppo" / "inbound"
    inbound.mkdir(parents=True, exist_ok=True)
    sub = inbound / "mallory+a1_ppo_objective+2024-01-01 10:00:00.000000 UTC+abc123"
    _submit(sub)
    (sub / "timestamp.txt").write_text("2024-01-01 10:00:00.000000 UTC\n")
    os.symlink(root / "gradebook.db", sub / "grades.db")
    os.link(root / "gradebook.db", sub / "grades_copy.db")
    honest = inbound / "honest+a1_ppo_objective+2024-01-01 10:00:00.000000 UTC+def456"
    _submit(honest)
    (honest / "timestamp.txt").write_text("2024-01-01 10:00:00.000000 UTC\n")
    run = _nbgrader(root, "collect", ASSIGNMENT, "--update", "--ExchangeCollect.check_owner=False", timeout=300)
    log = run.stdout + run.stderr
    dest = root / "submitted" / "mallory" / ASSIGNMENT
    assert (dest / (NB1 + ".ipynb")).is_file(), log[-4000:]
    assert (root / "submitted" / "honest" / ASSIGNMENT / (NB1 + ".ipynb")).is_file()
    for dirpath, _, files in os.walk(root / "submitted"):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink():
                with open(p, "rb") as fh:
                    assert fh.read(16) != SQLITE_MAGIC, f"{p} is a copy of the gradebook"
    assert "'mallory'" in log and "grades_copy.db" in log and "hard link" in log

