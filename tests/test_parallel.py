"""Parallel autograding on Dask (rlhf_lab.instructor.classrun.parallel), with real nbgrader, real Dask
LocalClusters, a real SQLite file and a real PostgreSQL server started here.

Expected grades never come from the code under test: the class runs are compared with plain
``nbgrader autograde ASSIGNMENT`` (upstream's own sequential loop) read back through nbgrader's
Gradebook API, and the toy course's scores follow from how its submissions were written.

Cost (2 cores): the fast tests take seconds; ``slow`` ones grade real classes (see the module
fixtures) and ``postgres`` ones start a PostgreSQL server (``pg_support``).
"""
from __future__ import annotations

import copy
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from fixtures.classes import example_class
from pg_support import create_database, postgres_server
from rlhf_lab.instructor.classrun import executors, parallel, pipeline
from rlhf_lab.instructor.classrun.parallel import (
    ParallelGradingError, cheapest_assignment, grade_class, replicate_class,
)

REPO = Path(__file__).resolve().parents[1]
COURSE_ID = "rlhf-ppo"  # nbgrader_config.py's course id (the toy course reuses that config)
#: The class of the class tests: one student of each outcome of the cheapest assignment (correct,
#: the unchanged release, a wrong answer, a delegated answer, a kernel that kills itself, a notebook
#: that is not JSON, a folder name with spaces and non-ASCII letters). Every example student grades
#: the same way on each path, so more of the same students add minutes and no new case; the bundled
#: class (all of them) is graded on the Dask path in tests/test_feedback_check.py and test_trust.py.
PARALLEL_CLASS = ("ada_correct", "ben_unchanged", "cy_dropped_signed_min", "fay_delegated_alias",
                  "h13_os_exit", "h24_invalid_json", "h29 zoë ångström")
#: RLHF_CLASS_SIZE=24 cycles through them (as the benchmark does, to measure speed-ups).
CLASS_SIZE = int(os.environ.get("RLHF_CLASS_SIZE", str(len(PARALLEL_CLASS))))


# ------------------------------------------------------------------------------------- helpers
def nbgrader_env(root: Path, db_url: str | None = None, **extra) -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["RLHF_COURSE_ROOT"] = str(root)
    env["RLHF_COURSE_DB"] = db_url or f"sqlite:///{root}/gradebook.db"
    env.pop("MPLBACKEND", None)
    env.update(extra)
    return env


def plain_nbgrader(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Upstream nbgrader itself, nothing of ours in between."""
    return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=root,
                          env=env or nbgrader_env(root), capture_output=True, text=True)


def cell_grades(db_url: str, assignment: str) -> dict:
    """``{(student, notebook, grade_id): (auto_score, manual_score, needs_manual_grade)}``."""
    from nbgrader.api import Gradebook

    out = {}
    with Gradebook(db_url, COURSE_ID) as gb:
        for sub in gb.find_assignment(assignment).submissions:
            for nb in sub.notebooks:
                for g in nb.grades:
                    out[(sub.student.id, nb.name, g.name)] = (
                        g.auto_score, g.manual_score, bool(g.needs_manual_grade))
    return out


def totals(db_url: str, assignment: str) -> dict:
    from nbgrader.api import Gradebook

    with Gradebook(db_url, COURSE_ID) as gb:
        return {s.student.id: (float(s.score), float(s.max_score))
                for s in gb.find_assignment(assignment).submissions}


def autograded_students(root: Path, assignment: str) -> set:
    auto = root / "autograded"
    return {p.name for p in auto.iterdir() if any((p / assignment).glob("*.ipynb"))} if auto.is_dir() else set()


def records(root: Path, assignment: str) -> dict:
    out = {}
    for p in (root / ".autograde_runs" / assignment).glob("*.json"):
        try:
            rec = json.loads(p.read_text())
        except ValueError:
            continue
        out[rec["student"]] = rec
    return out


def processes_in(root: Path) -> list:
    """Live processes whose working directory is inside ``root`` (nbgrader, kernels, workers)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            cwd = p.cwd()
        except (psutil.Error, OSError):
            continue
        if cwd == str(root) or cwd.startswith(str(root) + os.sep):
            found.append(p)
    return found


def psycopg2_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg2://", 1)


# ------------------------------------------------------------------------------- the toy course
TOY = "toy"
TOY_ANSWERS = {  # example student -> solution cell source (None: the release unchanged)
    "correct": "def add(a, b):\n    return a + b",
    "wrong": "def add(a, b):\n    return a - b",
    "unchanged": None,
    "kernelkill": "import os\nos._exit(1)",
    "loop": "while True:\n    pass",
}
TOY_MAX = 3.0  # test_add (2 points) + test_add_neg (1 point)


def build_toy_template(base: Path) -> tuple[Path, Path]:
    """A one-notebook course using the repository's real ``nbgrader_config.py`` and its examples.

    Returns (course root with ``source/toy``, submissions folder ``<student>/toy/toy.ipynb``).
    """
    root = base / "toy_course"
    (root / "source" / TOY).mkdir(parents=True)
    (root / "nbgrader_config.py").write_text((REPO / "nbgrader_config.py").read_text())
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}

    def cell(source, **md):
        c = nbformat.v4.new_code_cell(source)
        c.metadata["nbgrader"] = {"schema_version": 3, "task": False, **md}
        return c

    nb.cells = [
        cell("def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION",
             grade=False, solution=True, locked=False, grade_id="answer_add"),
        cell("assert add(1, 2) == 3", grade=True, solution=False, locked=True,
             grade_id="test_add", points=2),
        cell("assert add(-1, 5) == 4", grade=True, solution=False, locked=True,
             grade_id="test_add_neg", points=1),
    ]
    nbformat.write(nb, root / "source" / TOY / "toy.ipynb")
    release = base / "toy_release"
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", TOY, "--force",
                           f"--CourseDirectory.release_directory={release}",
                           f"--CourseDirectory.db_url=sqlite:///{base}/toy_template.db"],
                          cwd=root, env=nbgrader_env(root), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    released = nbformat.read(release / TOY / "toy.ipynb", as_version=4)
    subs = base / "toy_submissions"
    for name, answer in TOY_ANSWERS.items():
        sub = copy.deepcopy(released)
        if answer is not None:
            sub.cells[0].source = answer
        (subs / name / TOY).mkdir(parents=True)
        nbformat.write(sub, subs / name / TOY / "toy.ipynb")
    return root, subs


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return build_toy_template(tmp_path_factory.mktemp("toy"))


# ------------------------------------------------------------------------------------ fast tests
def test_sqlite_workers_get_a_busy_timeout_and_postgres_the_pinned_driver():
    assert parallel.worker_db_url("sqlite:////x/gradebook.db") == "sqlite:////x/gradebook.db?timeout=300"
    assert parallel.worker_db_url("sqlite:////x/g.db?timeout=7") == "sqlite:////x/g.db?timeout=7"
    pg = "postgresql+psycopg2://u:secret@h:5/db"
    assert parallel.worker_db_url(pg) == pg
    assert parallel.normalise_db_url("postgresql://u@h:5/db") == "postgresql+psycopg2://u@h:5/db"
    assert "secret" not in parallel.db_identity(pg)
    assert parallel.db_identity("sqlite:////x/g.db?timeout=7") == "sqlite:////x/g.db"


def test_progress_line_reports_the_student_the_counts_and_the_time_left():
    line = parallel.progress_line({"student": "b", "status": "failed", "seconds": 3.04}, 1, 1, 10,
                                  "about 2 min 00 s left")
    assert line == "  failed b 3.0 s | 2/10 done: graded 1, failed 1, remaining 8; about 2 min 00 s left"
    assert parallel.progress_line({"student": "a", "status": "graded", "seconds": 12.0}, 1, 0, 1) == \
        "  graded a 12.0 s | 1/1 done: graded 1, failed 0, remaining 0"


def test_the_phase_of_a_fan_out_writes_one_line_per_student_and_its_time_left(monkeypatch):
    """grade_class's progress is the project's progress phase: announced, a line per student, closed."""
    import io

    out = io.StringIO()

    def fake_grade_assignment(course, assignment, todo, executor, **kw):
        kw["stream"].write("a line of the pre-flight\n")  # what the layers below say goes out as a line too
        for student, status in zip(todo, ("graded", "failed")):
            kw["on_result"]({"student": student, "status": status, "seconds": 1.0})
        return "done"

    monkeypatch.setattr(parallel, "grade_assignment", fake_grade_assignment)
    from rlhf_lab.instructor.classrun import progress

    got = parallel._graded_with_progress(None, "a1", ["s1", "s2"], None, timeout=1.0, preflight=False,
                                         reporter=progress.Reporter(out=out, err=out), workers=2, on_result=None)
    lines = out.getvalue().splitlines()
    assert got == "done"
    assert lines[0] == "-> autograde: 2 students, 2 at a time (one nbgrader autograde per student of a1)"
    assert lines[1] == "a line of the pre-flight"
    assert lines[2].startswith("  graded s1 1.0 s | 1/2 done: graded 1, failed 0, remaining 1; about ")
    assert lines[3] == "  failed s2 1.0 s | 2/2 done: graded 1, failed 1, remaining 0; about 0 s left"
    assert lines[4].startswith("   autograde: done in ") and len(lines) == 5
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()  # not a terminal: no bar


def test_the_fan_out_has_no_front_end_of_its_own():
    """One ClassRun, one table formatter, one progress module: the fan-out's are the course's."""
    assert parallel.ClassRun is pipeline.ClassRun
    for name in ("Progress", "format_table", "_fmt_duration", "make_local_cluster", "DaskExecutor"):
        assert getattr(parallel, name, None) in (None, getattr(executors, name, None)), name
    assert not hasattr(pipeline, "usable_cores") and pipeline.ClassExecutor is executors.ClassExecutor


def test_the_run_table_lists_every_student_then_a_summary():
    results = [
        {"student": "ben", "assignment": "a1", "status": "failed", "seconds": 3.0, "returncode": 1, "attempt": 1,
         "reason": "the kernel died"},
        {"student": "ada", "assignment": "a1", "status": "graded", "seconds": 12.25, "returncode": 0, "attempt": 2,
         "reason": "", "score": 3.0, "max_score": 3.0},
    ]
    run = pipeline.ClassRun("/c", "sqlite:////c/gradebook.db?timeout=300", ["a1"],
                            [parallel.to_student_run(r) for r in results], mode="parallel", workers=2,
                            results=results, skipped={"cy": (1.0, 3.0)}, wall_seconds=90.0, sqlite_check="ok")
    assert pipeline.format_runs(run).splitlines() == [
        "student  status   score  time   try  reason",
        "-------  -------  -----  -----  ---  " + "-" * len("regraded (attempt 2) after an interrupted attempt"),
        "ada      graded   3/3    12.2s  2    regraded (attempt 2) after an interrupted attempt",
        "ben      failed   -      3.0s   1    the kernel died",
        "cy       skipped  1/3    -      -    already graded (use --force to regrade)",
        "",
        "a1: 1 graded, 1 failed, 1 skipped in 1 min 30 s (parallel, 2 workers, 1.3 students/min); "
        "gradebook sqlite:////c/gradebook.db; SQLite integrity_check: ok",
    ]
    assert run.to_json() == {"assignment": "a1", "mode": "parallel", "workers": 2, "db": "sqlite:////c/gradebook.db",
                             "results": results, "skipped": {"cy": (1.0, 3.0)}, "wall_seconds": 90.0,
                             "integrity": "ok", "students_per_minute": 2 / 90 * 60}


def test_parallel_sqlite_is_refused_when_a_worker_runs_on_another_machine():
    class FakeClient:  # what Client.run returns: {worker address: result}
        def run(self, fn):
            return {"tcp://10.0.0.5:1": "other-machine", "tcp://127.0.0.1:2": fn()}

    with pytest.raises(ParallelGradingError, match="postgresql"):
        executors.check_sqlite_hosts(FakeClient(), "sqlite:////x/gradebook.db?timeout=300")
    executors.check_sqlite_hosts(FakeClient(), "postgresql+psycopg2://u@h/db")  # fine


def test_a_student_counts_as_graded_only_after_a_finished_run_of_this_submission(tmp_path):
    course = parallel.Course(root=str(tmp_path), course_id=COURSE_ID, db_url="sqlite:///x.db",
                             submitted_directory="submitted", autograded_directory="autograded",
                             source_directory="source",
                             directory_structure=os.path.join("{nbgrader_step}", "{student_id}",
                                                              "{assignment_id}"))
    sid, a, url = "an na é", "a1", f"sqlite:///{tmp_path}/gradebook.db"
    (tmp_path / "submitted" / sid / a).mkdir(parents=True)
    (tmp_path / "submitted" / "other" / a).mkdir(parents=True)
    (tmp_path / "submitted" / sid / a / "nb.ipynb").write_text("{}")
    assert parallel.find_students(course, a) == ["an na é", "other"]
    record = {"student": sid, "state": "done", "db": parallel.db_identity(url + "?timeout=300"),
              "fingerprint": parallel.submission_fingerprint(course, a, sid)}
    parallel.write_record(course, a, sid, record)
    assert not parallel.is_completed(course, a, sid, url)  # no autograded notebook yet
    (tmp_path / "autograded" / sid / a).mkdir(parents=True)
    (tmp_path / "autograded" / sid / a / "nb.ipynb").write_text("{}")
    assert parallel.is_completed(course, a, sid, url, submitted_in_db={sid})
    assert not parallel.is_completed(course, a, sid, url, submitted_in_db=set())  # not in gradebook
    assert not parallel.is_completed(course, a, sid, "postgresql+psycopg2://u@h/db")  # other gradebook
    parallel.write_record(course, a, sid, record | {"state": "running"})  # interrupted attempt
    assert not parallel.is_completed(course, a, sid, url)
    parallel.write_record(course, a, sid, record)
    (tmp_path / "submitted" / sid / a / "nb.ipynb").write_text('{"resubmitted": 1}')
    assert not parallel.is_completed(course, a, sid, url)  # a new submission is graded again


def test_dask_grader_plugs_into_the_sequential_pipeline(monkeypatch):
    """``pipeline.run_class(..., grader=dask_grader())`` gets the pipeline's StudentRun list."""
    from rlhf_lab.instructor.classrun.pipeline import StudentRun

    seen = {}

    def fake_grade_class(assignment, **kw):
        seen.update(kw, assignment=assignment)
        result = {"student": "s1", "assignment": assignment, "status": "failed", "seconds": 1.5,
                  "returncode": 1, "reason": "the kernel died", "notes": ["n"], "log_tail": "t"}
        return pipeline.ClassRun("/course", kw["db_url"], [assignment], [parallel.to_student_run(result)],
                                 mode="parallel", workers=2, results=[result], wall_seconds=1.5)

    monkeypatch.setattr(parallel, "grade_class", fake_grade_class)
    runs = parallel.dask_grader(workers=3)("a1", ["s1"], "/course", "sqlite:///g.db", False)
    assert seen["students"] == ["s1"] and seen["workers"] == 3 and seen["force"] is False
    assert seen["root"] == "/course" and seen["db_url"] == "sqlite:///g.db"
    assert seen["preflight"] is False  # run_class ran it before handing over the students
    assert runs == [StudentRun("s1", "a1", False, 1.5, 1, "the kernel died", ["n"], "t")]


N_CELLS = 4


def _hammer_gradebook(args):
    """One process writing like nbgrader autograde: student + submission, then one commit per cell."""
    import warnings

    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    warnings.simplefilter("ignore", SAWarning)  # nbgrader's own add_submission is noisy
    url, students = args
    for sid in students:
        with Gradebook(url, COURSE_ID) as gb:
            gb.update_or_create_student(sid)
            gb.update_or_create_submission("a1", sid)
        with Gradebook(url, COURSE_ID) as gb:
            for k in range(N_CELLS):
                grade = gb.find_grade(f"t{k}", "nb", "a1", sid)
                grade.auto_score = float((len(sid) + k) % 3)
                grade.needs_manual_grade = False
                gb.db.commit()
    return len(students)


def test_concurrent_nbgrader_writers_on_one_sqlite_file_lose_nothing(tmp_path):
    """The SQLite design under load: 4 processes, nbgrader's own Gradebook, the worker URL."""
    from nbgrader.api import Gradebook

    db = tmp_path / "gradebook.db"
    url = f"sqlite:///{db}"
    with Gradebook(url, COURSE_ID) as gb:  # what prepare_gradebook does once before the fan-out
        gb.add_assignment("a1")
        gb.add_notebook("nb", "a1")
        for k in range(N_CELLS):
            gb.add_grade_cell(f"t{k}", "nb", "a1", max_score=2, cell_type="code")
    chunks = [[f"p{p}_s{i}" for i in range(10)] for p in range(4)]
    ctx = multiprocessing.get_context("fork")  # nbgrader is imported already: no re-import cost
    with ctx.Pool(4) as pool:
        done = pool.map(_hammer_gradebook, [(parallel.worker_db_url(url), c) for c in chunks])
    assert done == [10, 10, 10, 10]
    got = cell_grades(url, "a1")
    expected = {(sid, "nb", f"t{k}"): (float((len(sid) + k) % 3), None, False)
                for chunk in chunks for sid in chunk for k in range(N_CELLS)}
    assert got == expected
    assert parallel.sqlite_integrity(url) == "ok"


# ------------------------------------------------------------------------- toy class (slow, real)
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_crash_mid_run_then_rerun_grades_only_the_rest_and_hostile_ones_fail_alone(toy, tmp_path, monkeypatch):
    template, subs = toy
    monkeypatch.setenv("RLHF_CELL_TIMEOUT", "5")  # the looping student; cluster workers inherit it
    root = pipeline.copy_course(tmp_path / "course", template, assignments=[TOY])
    students = replicate_class(subs, TOY, 6, root)
    env = nbgrader_env(root, RLHF_CELL_TIMEOUT="5")
    cli = [sys.executable, "-m", "rlhf_lab.instructor.classrun.parallel", TOY, "--root", str(root)]

    # 1. a hard crash of the whole command (SIGKILL to its process group) partway through
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(cli + ["--workers", "2"], cwd=root, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            finished = [r for r in records(root, TOY).values() if r["state"] in ("done", "failed")]
            if len(finished) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        log.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30  # no nbgrader, kernel or worker outlives the crash
    while processes_in(root) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_in(root), [p.cmdline() for p in processes_in(root)]
    before = records(root, TOY)
    done_before = {s for s, r in before.items() if r["state"] in ("done", "failed")}
    interrupted = {s for s, r in before.items() if r["state"] == "running"}
    assert done_before and len(done_before) < len(students)

    # 2. the same command again, this time on an existing cluster (--scheduler): only what is
    #    missing is graded
    out = tmp_path / "second.json"
    with executors.make_local_cluster(2) as cluster:
        second = subprocess.run(cli + ["--scheduler", cluster.scheduler_address, "--json", str(out)],
                                cwd=root, env=env, capture_output=True, text=True)
    report = json.loads(out.read_text())
    failed_now = [r for r in report["results"] if r["status"] == "failed"]
    assert second.returncode == (1 if failed_now else 0), second.stdout + second.stderr
    assert cluster.scheduler_address in second.stderr
    assert report["workers"] == 2
    graded_now = {r["student"] for r in report["results"]}
    graded_before = {s for s, r in before.items() if r["state"] == "done"}
    assert set(report["skipped"]) == graded_before
    assert graded_now == set(students) - graded_before
    for r in report["results"]:
        if r["student"] in interrupted:
            assert r["attempt"] == 2, r
    assert "graded" in second.stdout and "remaining" in second.stderr and " left" in second.stderr
    # the parallel command ran the same integrity pre-flight as the sequential pipeline
    preflight = json.loads((root / "integrity" / f"{TOY}.json").read_text())
    assert set(preflight["students"]) <= set(students) and preflight["students"]

    # 3. everyone has the grade their submission deserves; the hostile ones fail alone. A killed
    #    kernel either fails that student (plain nbgrader) or, with the course's kernel guard,
    #    scores what ran: never a point, always a recorded reason.
    url = f"sqlite:///{root}/gradebook.db"
    scores = totals(url, TOY)
    final = records(root, TOY)
    for sid in students:
        kind = sid.split("__")[0]
        log_text = (root / ".autograde_runs" / TOY / f"{sid}.log").read_text()
        if kind == "kernelkill":
            assert "kernel died" in (final[sid]["reason"] + log_text).lower(), final[sid]
            assert final[sid]["state"] == "failed" or scores[sid] == (0.0, TOY_MAX)
        else:
            assert final[sid]["state"] == "done", final[sid]
            assert scores[sid] == ((TOY_MAX if kind == "correct" else 0.0), TOY_MAX), (sid, scores[sid])
    by_student = {r["student"]: r for r in report["results"]}
    for sid in students:
        if sid.startswith("loop") and sid in by_student:
            assert any("timeout" in n for n in by_student[sid]["notes"]), by_student[sid]
    snapshot = cell_grades(url, TOY)

    # 4. --sequential --force regrades (here three students, one of each outcome) with the plain
    #    loop: the very same grades
    again = [s for s in students if s.split("__")[0] in ("correct", "wrong", "kernelkill")][:3]
    third = subprocess.run(cli + ["--sequential", "--force", "--json", str(out)]
                           + [f"--student={s}" for s in again], cwd=root, env=env,
                           capture_output=True, text=True)
    report = json.loads(out.read_text())
    assert third.returncode == (1 if any(r["status"] == "failed" for r in report["results"]) else 0)
    assert report["mode"] == "sequential" and not report["skipped"]
    assert sorted(r["student"] for r in report["results"]) == sorted(again)
    assert cell_grades(url, TOY) == snapshot
    assert parallel.sqlite_integrity(url) == "ok"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pipeline_killed_while_a_notebook_runs_grades_that_student_again(toy, tmp_path):
    """sequential pipeline killed mid-notebook: the half-graded student is pending and re-graded"""
    from course_support import kill_tree
    from rlhf_lab.instructor.classrun import pipeline

    template, subs = toy
    root = pipeline.copy_course(tmp_path / "course", template, assignments=[TOY])
    url = f"sqlite:///{root}/gradebook.db"
    pipeline.generate(root, [TOY], url)  # release/ and the gradebook's assignment, as `make demo` does
    marker = tmp_path / "slow_is_running"
    slow = nbformat.read(subs / "correct" / TOY / "toy.ipynb", as_version=4)
    slow.cells[0].source = (  # the first run stops here (and is killed); the second goes straight on
        f"import pathlib, time\nif not pathlib.Path({str(marker)!r}).exists():\n"
        f"    pathlib.Path({str(marker)!r}).touch()\n    time.sleep(300)\n"
        "def add(a, b):\n    return a + b")
    folder = tmp_path / "submissions"
    (folder / "slow" / TOY).mkdir(parents=True)
    nbformat.write(slow, folder / "slow" / TOY / "toy.ipynb")
    shutil.copytree(subs / "correct", folder / "correct")
    driver = ("import sys\nfrom rlhf_lab.instructor.classrun import pipeline\n"
              "pipeline.run_class(sys.argv[1], root=sys.argv[2], db_url=sys.argv[3], names=['toy'],\n"
              "    fresh=False, regenerate=False, force=False, compile_cache=False,\n"
              "    progress=lambda r: print('DONE', r.student, flush=True))\n")
    cmd = [sys.executable, "-c", driver, str(folder), str(root), url]
    # The marker lives outside the student's folder, which a sandboxed kernel cannot see (that is the
    # sandbox's job, tested in test_sandbox.py): this test of the run records grades unsandboxed.
    run_env = {**nbgrader_env(root, url), "RLHF_NO_SANDBOX": "1", "RLHF_NO_SANDBOX_WARNED": "1"}
    proc = subprocess.Popen(cmd, cwd=root, env=run_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:  # the whole run dies: driver, nbgrader, kernel
        kill_tree(proc)
    first_out = proc.communicate()[0]
    assert marker.exists(), "the slow student's notebook never started:\n" + first_out
    assert "DONE correct" in first_out and "DONE slow" not in first_out, first_out

    # what a kill at this point leaves behind looks finished to a file check: nbgrader copied the
    # notebook into autograded/ before running it, and the submission row exists
    assert (root / "autograded" / "slow" / TOY / "toy.ipynb").exists()
    assert "slow" in totals(url, TOY)
    assert parallel.read_record(parallel.load_course(root, url), TOY, "slow")["state"] == "running"
    assert pipeline.pending(TOY, root, url) == ["slow"]

    second = subprocess.run(cmd, cwd=root, env=run_env, capture_output=True, text=True)
    assert second.returncode == 0, second.stdout + second.stderr
    assert [line for line in second.stdout.splitlines() if line.startswith("DONE")] == ["DONE slow"]
    assert totals(url, TOY) == {"correct": (TOY_MAX, TOY_MAX), "slow": (TOY_MAX, TOY_MAX)}
    assert parallel.read_record(parallel.load_course(root, url), TOY, "slow")["attempt"] == 2
    assert pipeline.pending(TOY, root, url) == []


# ------------------------------------------ the class: every example student once (slow)
@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    """The generated class and its sequential baseline, graded ONCE by plain nbgrader.

    The course's cheapest assignment; the bundled example students (correct, mistaken) and broken
    or hostile ones (``example_class``, :data:`PARALLEL_CLASS`), CLASS_SIZE of them. The baseline is upstream's own sequential loop,
    ``nbgrader autograde ASSIGNMENT``, in a fresh copy of the generated course.
    """
    from course_support import fresh_course, session_base

    base = session_base(tmp_path_factory)
    mine = tmp_path_factory.mktemp("class")
    assignment = cheapest_assignment(REPO, REPO / "examples" / "submissions")
    subs = example_class(mine / "examples", assignment, REPO, only=PARALLEL_CLASS)
    root = fresh_course(mine / "sequential", base)
    students = replicate_class(subs, assignment, CLASS_SIZE, root)
    t0 = time.monotonic()
    plain_nbgrader(root, "autograde", assignment)  # exit 1: the broken students fail
    seconds = time.monotonic() - t0
    url = f"sqlite:///{root}/gradebook.db"
    baseline = cell_grades(url, assignment)
    assert {k[0] for k in baseline} == set(students)
    graded = autograded_students(root, assignment)
    assert any(s.startswith("ada_correct") for s in graded)
    print(f"\n[class] {len(students)} students of {assignment} graded sequentially by plain "
          f"nbgrader in {seconds:.0f} s")
    return {"base": base, "mine": mine, "subs": subs, "assignment": assignment,
            "students": students, "baseline": baseline, "graded": graded,
            "totals": totals(url, assignment), "fresh_course": fresh_course}


def _kill_a_worker_mid_task(root: Path, assignment: str, stop: threading.Event, killed: dict):
    """Once one student is finished and another is being graded, SIGKILL that student's worker."""
    while not stop.is_set():
        recs = records(root, assignment).values()
        finished = [r for r in recs if r["state"] in ("done", "failed")]
        busy = [r for r in recs if r["state"] == "running" and r.get("child_pid")
                and r["worker_pid"] != os.getpid() and psutil.pid_exists(r["worker_pid"])]
        if finished and busy:
            victim = busy[0]
            killed.update(student=victim["student"], worker_pid=victim["worker_pid"],
                          child_pid=victim["child_pid"])
            os.kill(victim["worker_pid"], signal.SIGKILL)
            return
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_parallel_on_sqlite_gives_the_sequential_grades_even_when_a_worker_is_killed(klass, tmp_path):
    a = klass["assignment"]
    root = klass["fresh_course"](tmp_path / "parallel_sqlite", klass["base"])
    replicate_class(klass["subs"], a, CLASS_SIZE, root)
    stop, killed = threading.Event(), {}
    killer = threading.Thread(target=_kill_a_worker_mid_task, args=(root, a, stop, killed), daemon=True)
    killer.start()
    try:
        # default: a LocalCluster sized to the machine. The baseline is upstream nbgrader, which has
        # no integrity pre-flight, so the fan-out is compared without it (the pre-flight is on by
        # default and tested with the CLI above and in test_trust.py)
        run = grade_class(a, root=root, preflight=False)
    finally:
        stop.set()
        killer.join()
    url = f"sqlite:///{root}/gradebook.db"
    assert killed, "no worker was killed: the run finished before a student was mid-task"
    assert not psutil.pid_exists(killed["child_pid"]) or \
        psutil.Process(killed["child_pid"]).status() == psutil.STATUS_ZOMBIE
    by_student = {r["student"]: r for r in run.results}
    assert sorted(by_student) == sorted(klass["students"])  # every student has an outcome
    victim = by_student[killed["student"]]
    assert victim["attempt"] == 2 and victim["worker_pid"] != killed["worker_pid"], victim
    assert {s for s, r in by_student.items() if r["status"] == "graded"} == klass["graded"]
    assert cell_grades(url, a) == klass["baseline"]
    assert totals(url, a) == klass["totals"]
    assert run.sqlite_check == "ok" and parallel.sqlite_integrity(url) == "ok"
    assert run.workers == executors.default_workers()
    print(f"\n[class] parallel on SQLite ({run.workers} workers, one killed): "
          f"{run.wall_seconds:.0f} s for {len(run.results)} students")


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(1800)
def test_parallel_on_postgresql_gives_the_sequential_grades(klass, tmp_path):
    a = klass["assignment"]
    root = klass["fresh_course"](tmp_path / "parallel_pg", klass["base"])
    replicate_class(klass["subs"], a, CLASS_SIZE, root)
    env = nbgrader_env(root)
    with postgres_server() as server:
        url = create_database(server, "gradebook")  # fresh: schema created before the fan-out
        out = tmp_path / "run.json"
        proc = subprocess.run([sys.executable, "-m", "rlhf_lab.instructor.classrun.parallel", a,
                               "--root", str(root), "--db", url, "--json", str(out),
                               "--no-preflight"],  # as upstream nbgrader, the baseline
                              cwd=root, env=env, capture_output=True, text=True)
        report = json.loads(out.read_text())
        failed = {r["student"] for r in report["results"] if r["status"] == "failed"}
        assert proc.returncode == (1 if failed else 0), proc.stdout + proc.stderr
        assert report["workers"] == executors.default_workers()
        assert {r["student"] for r in report["results"]} - failed == klass["graded"]
        assert cell_grades(psycopg2_url(url), a) == klass["baseline"]
        assert totals(psycopg2_url(url), a) == klass["totals"]
        # nothing went to the course's SQLite gradebook (the template's copy, assignment only)
        assert totals(f"sqlite:///{root}/gradebook.db", a) == {}
    for sid in klass["students"]:
        assert sid in proc.stdout  # the final table lists every student
    print(f"\n[class] parallel on PostgreSQL ({report['workers']} workers): "
          f"{report['wall_seconds']:.0f} s for {len(report['results'])} students")
