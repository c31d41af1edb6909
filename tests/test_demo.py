"""`make demo` (``python -m rlhf_lab.demo``) as a new user meets it (issue 22).

* it runs in a scratch copy of the course (``course_run/``): the course's own gradebook, exchange,
  release and outputs are byte for byte what they were, and the demo's results are where it says;
* every phase is announced, with a progress bar (tqdm, pinned) on stderr only when it is a terminal
  or forced, and an estimate; stdout, where the table is printed, never holds a bar;
* the grade table keeps autograded points apart from hand-graded points still pending, and its
  reason column says what the integrity pre-flight did (blocked, withheld N points, library copy);
* the class is graded on a pool of the usable cores, with the same grades as one at a time.

The fast tests build their inputs by hand; the ``slow`` ones run the real demo twice (two
workers, then one) on a copy of the course made here, never on the repository itself.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_support import LIBRARY_LOG, REPO
from rlhf_lab import demo
from rlhf_lab.instructor.classrun import pipeline, progress
from rlhf_lab.instructor.grader import integrity

A = "a1_ppo_objective"


# ------------------------------------------------------------------------------ the progress library
def test_the_progress_library_is_pinned_installed_and_in_environment_yml():
    pins = [ln.strip() for ln in (REPO / "requirements.txt").read_text().splitlines()]
    assert "tqdm==4.70.1" in pins
    assert "      - tqdm==4.70.1" in (REPO / "environment.yml").read_text().splitlines()
    assert importlib.metadata.version("tqdm") == "4.70.1"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _one_phase(reporter):
    with reporter.phase("autograde", 3, unit="submission", estimate=30.0, workers=2, what="nbgrader") as ph:
        ph.advance()
        ph.write("  autograded a1 ada ok")
        ph.advance(2)


def test_bars_go_to_stderr_only_on_a_terminal_or_when_forced(monkeypatch):
    monkeypatch.delenv(progress.FORCE_ENV, raising=False)
    # a log (stderr not a terminal): the phase is announced on stdout, no bar anywhere
    out, err = io.StringIO(), io.StringIO()
    _one_phase(progress.Reporter(out=out, err=err))
    assert err.getvalue() == ""
    lines = out.getvalue().splitlines()
    assert lines[0] == "-> autograde: 3 submissions, 2 at a time; estimate 30 s (nbgrader)"
    assert lines[1] == "  autograded a1 ada ok"
    assert re.fullmatch(r"   autograde: done in \d+ s", lines[2])
    # a terminal: the bar is drawn on stderr, and stdout still holds only the lines
    out, err = io.StringIO(), _Terminal()
    _one_phase(progress.Reporter(out=out, err=err))
    assert "autograde:" in err.getvalue() and "%|" in err.getvalue() and "submission" in err.getvalue()
    assert "%|" not in out.getvalue() and "\r" not in out.getvalue()
    assert "  autograded a1 ada ok" in out.getvalue().splitlines()
    # forced (RLHF_PROGRESS=1, what --progress does) on a log; switched off on a terminal
    monkeypatch.setenv(progress.FORCE_ENV, "1")
    assert progress.bars_wanted(io.StringIO())
    monkeypatch.setenv(progress.FORCE_ENV, "0")
    assert not progress.bars_wanted(_Terminal())


def test_the_estimate_is_the_prior_until_items_finish_then_the_measured_rate():
    rep = progress.Reporter(out=io.StringIO(), err=io.StringIO(), announce=False)
    ph = progress.Phase(rep, "seeds", 3, estimate=90.0, weights=[1, 2, 1])
    ph.start -= 10  # ten seconds in, nothing finished: the prior minus the time spent
    assert ph.eta() == pytest.approx(80.0, abs=1.0)
    assert ph.postfix().startswith("about 1 min 2")
    ph.advance()  # the first item (weight 1 of 4) took 10 s: 30 s for the three left
    assert ph.eta() == pytest.approx(30.0, abs=1.0)
    late = progress.Phase(rep, "seeds", 2, estimate=5.0)
    late.start -= 10
    assert late.eta() is None and "slower than the estimate of 5 s" in late.postfix()


# ------------------------------------------------------------------------------------ the grade table
def _grades():
    """Three students of one assignment: 8 autograded points (two tests), 4 by hand (one answer)."""
    layout = {A: [("01_nb", "test_a", "test", 5.0), ("01_nb", "test_b", "test", 3.0), ("01_nb", "essay", "manual", 4.0)]}
    C = pipeline.CellGrade
    cells = [
        # ada: both tests passed, the essay waits for a grader
        C("ada", A, "01_nb", "test_a", "test", 5.0, 5.0, False, 5.0, None),
        C("ada", A, "01_nb", "test_b", "test", 3.0, 3.0, False, 3.0, None),
        C("ada", A, "01_nb", "essay", "manual", None, 4.0, True, None, None),
        # hugo: the pre-flight withheld test_a (manual score 0 over the autograder's 5); essay graded 2
        C("hugo", A, "01_nb", "test_a", "test", 0.0, 5.0, False, 5.0, 0.0),
        C("hugo", A, "01_nb", "test_b", "test", 3.0, 3.0, False, 3.0, None),
        C("hugo", A, "01_nb", "essay", "manual", 2.0, 4.0, False, None, 2.0),
        # lib: a library copy, all points
        C("lib", A, "01_nb", "test_a", "test", 5.0, 5.0, False, 5.0, None),
        C("lib", A, "01_nb", "test_b", "test", 3.0, 3.0, False, 3.0, None),
        C("lib", A, "01_nb", "essay", "manual", None, 4.0, True, None, None),
    ]
    totals = {("ada", A): (8.0, 12.0), ("hugo", A): (5.0, 12.0), ("lib", A): (8.0, 12.0)}
    return pipeline.Grades(cells, totals, layout)


def _report():
    F = integrity.Finding
    return integrity.IntegrityReport(A, [
        F("hugo", A, "01_nb.ipynb", 3, "answer_a", 2, "rebinding", integrity.BLOCK,
          "rebinds np.testing.assert_allclose", withhold=(("01_nb.ipynb", "test_a"),)),
        F("lib", A, "01_nb.ipynb", 2, "answer_a", 1, "library-copy", integrity.WARN,
          "answer_a defines f, which is rlhf_lab.ppo.clipped_surrogate up to names; reported for review "
          "(the answer is judged on its outputs)"),
        F("bad\nname", A, None, None, None, None, "student-id-unusable", integrity.BLOCK,
          "the folder name holds a newline: nbgrader cannot address it"),
        F("lib", A, "notes.txt", None, None, None, "extra-file", integrity.WARN, "an extra file"),
    ], ["ada", "hugo", "lib", "bad\nname"])


def _row(table: str, student: str) -> list[str]:
    line = next(ln for ln in table.splitlines() if ln.startswith(student + " "))
    return re.split(r"\s{2,}", line.strip())


def test_the_table_keeps_autograded_points_apart_from_pending_hand_grading_and_gives_reasons():
    grades = _grades()
    runs = [pipeline.StudentRun("ada", A, True, 1.0, 0, notes=["late submission: 2 hours"]),
            pipeline.StudentRun("cyd", A, False, 1.0, 1, reason="the kernel died while running the submission")]
    reasons = pipeline.student_reasons(runs, {A: _report()}, grades)
    table = pipeline.format_tables(grades, runs, reasons)
    assert "Grades per student" in table
    # ada: every autograded point, the essay's 4 points pending (not a 0 that reads as failing)
    assert _row(table, "ada") == ["ada", A, "8 / 8", "-", "4", "8 / 12", "late submission: 2 hours"]
    # hugo: the withheld test counts as set by hand (0), the graded essay 2: the csv's rule
    assert grades.breakdown("hugo", A) == (3.0, 2.0, 0.0)
    hugo = _row(table, "hugo")
    assert hugo[2:6] == ["3 / 8", "2", "-", "5 / 12"]
    assert hugo[6].startswith("pre-flight withheld 5 points for review (1 cell; rebinding: rebinds np.testing")
    lib = _row(table, "lib")
    assert lib[6].startswith("library copy flagged (1): answer_a defines f, which is rlhf_lab.ppo.clipped_surrogate")
    assert "pre-flight: 1 warning (extra-file; integrity/a1_ppo_objective.json)" in lib[6]
    assert _row(table, "cyd")[2] == "FAILED"
    assert "autograde failed: the kernel died" in _row(table, "cyd")[-1]
    assert reasons[("bad\nname", A)] == ["pre-flight blocked grading: the folder name holds a newline: "
                                         "nbgrader cannot address it"]


# ------------------------------------------------------------------------------------- the scratch copy
def _small_course(tmp_path: Path) -> Path:
    root = pipeline.copy_course(tmp_path / "course", REPO, include=("nbgrader_config.py", "source", "examples"))
    seed = root / ".cache" / "jax-compile-seed" / A
    seed.mkdir(parents=True)
    (seed / "MANIFEST.json").write_text('{"key": {}, "files": {}}')
    return root


def test_the_scratch_copy_is_made_anew_and_never_replaces_a_folder_it_did_not_make(tmp_path):
    course = _small_course(tmp_path)
    before = sorted(str(p.relative_to(course)) for p in course.rglob("*"))
    foreign = course / demo.DEFAULT_WORKDIR
    foreign.mkdir()
    (foreign / "my_notes.txt").write_text("mine")
    with pytest.raises(pipeline.PipelineError, match="not a copy made by the demo"):
        demo.scratch_copy(course, foreign)
    assert (foreign / "my_notes.txt").read_text() == "mine"
    shutil.rmtree(foreign)

    copy = demo.scratch_copy(course, course / demo.DEFAULT_WORKDIR)
    assert (copy / demo.MARKER).is_file() and (copy / "nbgrader_config.py").is_file()
    assert (copy / ".cache" / "jax-compile-seed" / A / "MANIFEST.json").is_file()  # the course's seed
    (copy / "gradebook.db").write_text("the demo's earlier gradebook")
    (copy / "feedback").mkdir()
    again = demo.scratch_copy(course, copy)
    assert again == copy and not (copy / "gradebook.db").exists() and not (copy / "feedback").exists()
    after = sorted(str(p.relative_to(course)) for p in course.rglob("*") if demo.DEFAULT_WORKDIR not in p.parts)
    assert after == before  # only course_run/ was written


# --------------------------------------------------------------------------------- the real demo, twice
#: What the course's week owns: after a demo, each is byte for byte what it was.
COURSE_PATHS = ("gradebook.db", "exchange", "release", "submitted", "autograded", "feedback", "grades.csv",
                pipeline.REPORT_NAME, "integrity", ".autograde_runs", ".cache", "source", "examples",
                "nbgrader_config.py")
CLASS = {"ada_correct": "submissions", "cy_dropped_signed_min": "submissions",
         "h04_patch_np_testing": "hostile", "h49_pasted_library_source": "hostile"}


def snapshot(root: Path) -> dict:
    """``{relative path: (kind, size, sha256 or link target)}`` of :data:`COURSE_PATHS` under ``root``."""
    out = {}
    for name in COURSE_PATHS:
        top = root / name
        paths = [top] + (sorted(top.rglob("*")) if top.is_dir() and not top.is_symlink() else [])
        for p in paths:
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", 0, os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", 0, "")
            elif p.is_file():
                out[rel] = ("file", p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            elif not os.path.lexists(p):
                out[rel] = ("missing", 0, "")
    return out


def _plant_a_week(root: Path) -> None:
    """What an instructor's real week leaves in the course: gradebook, exchange, outputs."""
    (root / "gradebook.db").write_bytes(b"the instructor's own gradebook")
    inbound = root / "exchange" / "rlhf-ppo" / "inbound" / f"ada_correct+{A}+2026-12-01 10:00:00.000000 UTC+x"
    inbound.mkdir(parents=True)
    (inbound / "01_clipped_objective.ipynb").write_text("{}")
    for folder, name in (("submitted", "01_clipped_objective.ipynb"), ("autograded", "01_clipped_objective.ipynb"),
                         ("feedback", "01_clipped_objective.html")):
        (root / folder / "zoe_real" / A).mkdir(parents=True)
        (root / folder / "zoe_real" / A / name).write_text(f"zoe's {folder}")
    (root / "autograded" / ".gitkeep").write_text("")
    (root / "grades.csv").write_text("assignment,student_id,score\na1_ppo_objective,zoe_real,40\n")
    (root / pipeline.REPORT_NAME).write_text("{}\n")
    (root / "integrity").mkdir()
    (root / "integrity" / f"{A}.json").write_text("{}\n")
    (root / ".autograde_runs" / A).mkdir(parents=True)
    (root / ".autograde_runs" / A / "zoe_real.json").write_text("{}\n")


def _class_folder(dest: Path) -> Path:
    """The demo's class: two bundled students and two hostile ones (completed with the second notebook)."""
    good = REPO / "examples" / "submissions" / "ada_correct" / A
    for sid, where in CLASS.items():
        shutil.copytree(REPO / "examples" / where / sid / A, dest / sid / A)
        for nb in good.glob("*.ipynb"):
            if not (dest / sid / A / nb.name).exists():
                shutil.copy2(nb, dest / sid / A / nb.name)
    return dest


def _gradebook_cells(root: Path) -> dict:
    from nbgrader.api import Gradebook

    with Gradebook("sqlite:///" + str(root / "gradebook.db"), pipeline.COURSE_ID) as gb:
        return {(s.student.id, nb.name, g.name): (g.auto_score, g.manual_score, g.needs_manual_grade)
                for s in gb.find_assignment(A).submissions for nb in s.notebooks for g in nb.grades}


def _table(stdout: str) -> str:
    start = stdout.index("Grades per student")
    return stdout[start:stdout.index("\nfeedback:", start)]


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """A copy of the course with a week in it; the demo on it with 2 workers (default folder,
    bars forced), then with 1 (``--workdir``); the course snapshotted before and after."""
    from rlhf_lab.instructor.grader import compile_cache

    base = tmp_path_factory.mktemp("demo")
    course = pipeline.copy_course(base / "course", REPO)
    assert compile_cache.ensure_seed(course, A).problem == ""  # the course's seed: the demo reuses it
    _plant_a_week(course)
    klass = _class_folder(base / "class")
    before = snapshot(course)
    env = {k: v for k, v in os.environ.items() if k not in ("RLHF_COURSE_DB", "RLHF_EXCHANGE", "RLHF_PROGRESS")}
    env["RLHF_COURSE_ROOT"] = str(course)
    cmd = [sys.executable, "-m", "rlhf_lab.demo", "--assignment", A, "--submissions", str(klass)]
    runs = {}
    for name, extra in (("parallel", ["--workers", "2", "--progress"]),
                        ("sequential", ["--workers", "1", "--workdir", str(base / "sequential")])):
        proc = subprocess.run(cmd + extra, cwd=course, env=env, capture_output=True, text=True, timeout=2400)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[name] = proc
    return {"course": course, "before": before, "after": snapshot(course), "runs": runs,
            "roots": {"parallel": course / demo.DEFAULT_WORKDIR, "sequential": base / "sequential"}}


@pytest.mark.slow
def test_the_demo_leaves_the_course_as_it_was_and_says_where_its_results_are(demo_runs):
    assert demo_runs["after"] == demo_runs["before"]
    out = demo_runs["runs"]["parallel"].stdout
    root = demo_runs["roots"]["parallel"]
    assert f"course copied to {root} " in out and f"results:  all in {root}" in out
    assert f"csv:      {root / 'grades.csv'}" in out
    for name in ("gradebook.db", "grades.csv", pipeline.REPORT_NAME, f"integrity/{A}.json"):
        assert (root / name).is_file(), name
    assert sorted(p.name for p in (root / "submitted").iterdir()) == sorted(CLASS)
    inbound = {p.name.split("+")[0] for p in (root / "exchange" / "rlhf-ppo" / "inbound").iterdir()}
    assert inbound == set(CLASS)
    report = json.loads((root / pipeline.REPORT_NAME).read_text())
    assert report["workers"] == 2
    assert report["compile_cache_seeds"][A]["rebuilt"] is False  # the course's up-to-date seed was copied


@pytest.mark.slow
def test_every_phase_is_announced_and_bars_stay_on_stderr(demo_runs):
    proc = demo_runs["runs"]["parallel"]
    for phase in ("course copy", "generate", "roster", "hand in", "autograde", "feedback", "export",
                  "release feedback"):
        assert re.search(rf"^-> {phase}: .*estimate", proc.stdout, re.M), phase
        assert re.search(rf"^   {phase}: done in ", proc.stdout, re.M), phase
    assert "autograde: 4 submissions, 2 at a time" in proc.stdout
    assert "%|" in proc.stderr and "autograde:" in proc.stderr  # --progress: bars on stderr
    assert "%|" not in proc.stdout and "\r" not in proc.stdout
    seq = demo_runs["runs"]["sequential"]
    assert "%|" not in seq.stderr  # not a terminal, not forced: no bar
    for text in (proc.stdout + proc.stderr, seq.stdout + seq.stderr):
        assert not LIBRARY_LOG.search(text), text[-3000:]
        assert "warnings.warn" not in text and "Traceback" not in text, text[-3000:]


@pytest.mark.slow
def test_the_table_shows_pending_hand_grading_and_what_the_pre_flight_did(demo_runs):
    import csv

    out = demo_runs["runs"]["parallel"].stdout
    table = _table(out)
    ada = _row(table, "ada_correct")
    assert ada[2] == "31 / 31" and ada[4] == "15" and ada[5] == "31 / 46"
    assert "withheld" in _row(table, "h04_patch_np_testing")[-1]
    assert "pre-flight withheld" in _row(table, "h04_patch_np_testing")[-1]
    assert _row(table, "h49_pasted_library_source")[-1].startswith("library copy flagged")
    # the table's columns are grades.csv's auto_score, manual_score, pending_manual_points
    root = demo_runs["roots"]["parallel"]
    with open(root / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh) if r["assignment"] == A}
    for sid in CLASS:
        row = _row(table, sid)
        assert row[2] == f"{float(rows[sid]['auto_score']):g} / 31", (sid, row)
        assert row[4] == (f"{float(rows[sid]['pending_manual_points']):g}"
                          if float(rows[sid]["pending_manual_points"]) else "-"), (sid, row)
        assert row[5] == f"{float(rows[sid]['score']):g} / {float(rows[sid]['max_score']):g}"


@pytest.mark.slow
def test_two_workers_give_the_grades_of_one_cell_by_cell(demo_runs):
    par, seq = (demo_runs["roots"][k] for k in ("parallel", "sequential"))
    cells = _gradebook_cells(par)
    assert cells and cells == _gradebook_cells(seq)
    assert {s for (s, _, _) in cells} == set(CLASS)
    assert _table(demo_runs["runs"]["parallel"].stdout) == _table(demo_runs["runs"]["sequential"].stdout)
    assert json.loads((seq / pipeline.REPORT_NAME).read_text())["workers"] == 1
