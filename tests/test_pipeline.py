"""The instructor pipeline on the real course, with real nbgrader (issue 3).

Fast tests check the configuration, the committed release and the committed example class. The
``slow`` tests grade the bundled example class ONCE per session (``bundled_class_run`` from
course_support.py: generate -> collect -> autograde, one nbgrader process per student -> feedback ->
export) and check every student's grades cell by cell against what each example is built to do.
"""
from __future__ import annotations

import copy
import csv
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from nbgrader.utils import determine_grade

from course_support import (  # noqa: F401  (fixtures are used by name)
    REPO, autograde_mistakes, bundled_class_run, course_template_dir, fresh_course, mistakes, own_db, seeded_template_dir,
    session_base,
)
from fixtures import submissions
from rlhf_lab.instructor.classrun import pipeline
from rlhf_lab.instructor.operations import release
from rlhf_lab.instructor.grader.preprocessors import relabel_stderr

GRADED = pipeline.graded_assignments(REPO)


# ------------------------------------------------------------------------------------ fast checks
def test_config_sets_course_root_db_timeout_and_stderr_step(tmp_path, monkeypatch):
    settings = pipeline.check_config(REPO)
    assert settings["course_id"] == "rlhf-ppo"
    assert settings["root"] == str(REPO)
    assert settings["db_url"] == f"sqlite:///{REPO / 'gradebook.db'}"
    assert settings["timeout"] == 60
    names = settings["autograde_preprocessors"]
    assert names.index("Execute") < names.index("StderrToStdout") < names.index("SaveAutoGrades")
    # the overrides used by tests, --workdir and the parallel grader
    monkeypatch.setenv("RLHF_COURSE_DB", "postgresql://grader@127.0.0.1:5/gb")
    other = pipeline.check_config(REPO, db_url="postgresql://grader@127.0.0.1:5/gb")
    assert other["db_url"] == "postgresql://grader@127.0.0.1:5/gb"


def test_a_copy_of_the_course_grades_into_its_own_root(tmp_path):
    root = pipeline.copy_course(tmp_path / "copy", REPO)
    settings = pipeline.check_config(root)
    assert settings["root"] == str(root)
    assert settings["db_url"] == f"sqlite:///{root / 'gradebook.db'}"


def test_nbgrader_subprocess_env_puts_venv_bin_first_and_drops_agg_backend(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    env = pipeline.nbgrader_env(REPO)
    assert env["PATH"].split(":")[0] == pipeline.venv_bin()
    assert "MPLBACKEND" not in env
    assert env["RLHF_COURSE_ROOT"] == str(REPO)
    assert env["JAX_PLATFORMS"] == "cpu"
    assert "PYTEST_CURRENT_TEST" not in env  # it would switch off ipykernel's native-stderr capture


def test_stderr_relabel_turns_a_zero_into_full_points_but_never_rescues_an_error():
    def cell(outputs):
        return nbformat.from_dict({
            "cell_type": "code", "source": "", "execution_count": 1, "outputs": outputs,
            "metadata": {"nbgrader": {"grade": True, "solution": False, "points": 3, "grade_id": "t"}},
        })

    warning = {"output_type": "stream", "name": "stderr", "text": "UserWarning: harmless\n"}
    noisy = cell([copy.deepcopy(warning)])
    assert determine_grade(noisy) == (0, 3.0)  # what plain nbgrader does
    assert relabel_stderr(noisy.outputs, "[stderr] ") == 1
    assert determine_grade(noisy) == (3.0, 3.0)
    assert noisy.outputs[0]["text"] == "[stderr] UserWarning: harmless\n"
    failing = cell([copy.deepcopy(warning), {"output_type": "error", "ename": "AssertionError",
                                             "evalue": "wrong", "traceback": []}])
    relabel_stderr(failing.outputs, "[stderr] ")
    assert determine_grade(failing) == (0, 3.0)


def test_committed_examples_equal_a_fresh_build():
    diff = submissions.examples_diff(REPO)
    assert not diff, f"examples/submissions is stale (run tools/make_examples.py): {diff[:10]}"


def test_example_class_has_correct_unchanged_noisy_and_one_student_per_recipe():
    ex = submissions.build_examples(REPO)
    students = {rel.split("/")[0] for rel in ex.files}
    assert {ex.correct, ex.unchanged, ex.noisy} <= students
    assert set(ex.mistakes) <= students
    recipes = submissions.all_mistakes(REPO)
    assert len(ex.mistakes) == len(recipes) >= 5
    for a in GRADED:
        release_nbs = pipeline.notebooks(a, REPO, where="release")
        for sid in (ex.correct, ex.unchanged):
            assert sorted(k.split("/")[2][:-6] for k in ex.files if k.startswith(f"{sid}/{a}/")) == release_nbs
    # a mistake student differs from the correct one in exactly the recipe's cell
    for sid, m in ex.mistakes.items():
        for nb_name in pipeline.notebooks(m.assignment, REPO, where="release"):
            mine = nbformat.reads(ex.files[f"{sid}/{m.assignment}/{nb_name}.ipynb"], as_version=4)
            good = nbformat.reads(ex.files[f"{ex.correct}/{m.assignment}/{nb_name}.ipynb"], as_version=4)
            changed = [submissions.grade_id(a) for a, b in zip(mine.cells, good.cells) if a != b]
            assert changed == ([m.grade_id] if nb_name == m.notebook else []), (sid, nb_name, changed)


def test_unchanged_example_is_byte_identical_to_the_release():
    for a in GRADED:
        for path in sorted((REPO / "release" / a).glob("*.ipynb")):
            sub = REPO / "examples" / "submissions" / submissions.UNCHANGED / a / path.name
            assert nbformat.read(sub, as_version=4) == nbformat.read(path, as_version=4)


def test_release_holds_no_solution_hidden_test_or_rubric_text():
    assert release.leaks(REPO) == []


def test_leak_scan_catches_a_planted_solution_line(tmp_path):
    """The scanner itself must be able to fail: plant one solution line into a release copy."""
    root = pipeline.copy_course(tmp_path / "c", REPO, include=("nbgrader_config.py", "source", "release"))
    a = GRADED[0]
    src = sorted((root / "source" / a).glob("*.ipynb"))[0]
    secret, public = release.secret_lines(nbformat.read(src, as_version=4))
    line = max(secret - public, key=len)
    rel = root / "release" / a / src.name
    nb = nbformat.read(rel, as_version=4)
    target = next(c for c in nb.cells if c.cell_type == "code" and submissions.is_solution(c))
    target.source += "\n" + line
    nbformat.write(nb, rel)
    found = release.leaks(root)
    assert any(repr(line) in f for f in found), found


@pytest.mark.slow
def test_release_is_in_sync_with_source():
    diff = release.release_diff(REPO)
    assert not diff, f"release/ differs from a fresh nbgrader generate_assignment (tools/make_release.py): {diff}"


# --------------------------------------------------------------------------------------- validate
@pytest.mark.slow
def test_validate_passes_on_source_and_fails_on_the_unchanged_release(course_template_dir):
    from concurrent.futures import ThreadPoolExecutor

    jobs = []  # (notebooks, should pass): one nbgrader validate each, two at a time (2 cores)
    for a in GRADED:
        jobs.append((sorted((course_template_dir / "source" / a).glob("*.ipynb")), True))
        jobs.append((sorted((course_template_dir / "release" / a).glob("*.ipynb"))[:1], False))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: pipeline.validate(job[0], course_template_dir), jobs))
    for (paths, should_pass), found in zip(jobs, results):
        assert [Path(r.path) for r in found] == [p.resolve() for p in paths]
        for result in found:
            if should_pass:
                assert result.passed, f"nbgrader validate failed on {result.path}:\n{result.output[-3000:]}"
            else:
                assert not result.passed and result.failed_cells > 0, result.output[-2000:]


# ------------------------------------------------------------------------------ the demo command
@pytest.mark.slow
def test_demo_command_grades_prints_the_tables_and_resumes_only_what_is_unfinished(seeded_template_dir, tmp_path):
    """`python -m rlhf_lab.demo` (what `make demo` runs) on a course copy, then `--resume` after an interruption"""
    import shutil
    import subprocess
    import sys

    from rlhf_lab.instructor.classrun import parallel

    work = tmp_path / "course"
    shutil.copytree(seeded_template_dir / ".cache", work / ".cache")  # the session's seeds (same key)
    a, students = "a1_ppo_objective", ["ada_correct", "cy_dropped_signed_min"]
    cmd = [sys.executable, "-m", "rlhf_lab.demo", "--workdir", str(work), "--assignment", a]
    cmd += [f"--student={s}" for s in students]
    env = {k: v for k, v in os.environ.items() if k != "RLHF_COURSE_DB"}

    def graded_lines(out):
        return sorted(line.split()[2] for line in out.splitlines() if line.strip().startswith("autograded "))

    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert graded_lines(first.stdout) == students, first.stdout
    assert "Grades per student" in first.stdout and f"Per test cell: {a}" in first.stdout
    grades = pipeline.read_grades(work, own_db(work))
    tests = {s: [c for c in grades.by_cell(s, a).values() if c.kind == "test"] for s in students}
    assert tests["ada_correct"] and all(c.score == c.max_score for c in tests["ada_correct"])
    assert any(c.score < c.max_score for c in tests["cy_dropped_signed_min"])  # the mistake loses points
    for s in students:
        assert (work / "feedback" / s / a).is_dir()
    # the real exchange path: nbgrader's own submit left one inbound entry per student, and
    # nbgrader collect copied it with nbgrader's timestamp into submitted/
    inbound = sorted(p.name.split("+")[0] for p in (work / "exchange" / "rlhf-ppo" / "inbound").iterdir())
    assert inbound == students
    for s in students:
        assert (work / "submitted" / s / a / "timestamp.txt").is_file()
    assert "roster:" in first.stdout and "held:" in first.stdout
    # output meant for a person: no library log lines on the terminal or in the students' feedback
    noise = re.compile(r"^\s*(\[\w+App\] (WARNING|ERROR)|\[\w+App \| (WARNING|ERROR)\]|[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+"
                       r"|.*cpu_aot_loader|.*Assume version compatibility)", re.M)
    assert not noise.findall(first.stdout + first.stderr), (first.stdout + first.stderr)[-3000:]
    xla_log = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\.cc:\d+\]|cpu_aot_loader")
    pages = sorted((work / "feedback").rglob("*.html")) + sorted((work / "autograded").rglob("*.ipynb"))
    assert pages and not [p for p in pages if xla_log.search(p.read_text(encoding="utf-8", errors="replace"))]
    assert grades.totals  # the roster gave names: the gradebook knows them
    from rlhf_lab.instructor.operations import roster
    assert roster.gradebook_students(work, own_db(work))["ada_correct"][:2] == ("Ada", "Okafor")

    # an interruption while cy was being graded: its record never got past 'running'
    course = parallel.load_course(work, own_db(work))
    record = parallel.read_record(course, a, "cy_dropped_signed_min")
    parallel.write_record(course, a, "cy_dropped_signed_min", {**record, "state": "running"})
    again = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=1800)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert graded_lines(again.stdout) == ["cy_dropped_signed_min"], again.stdout
    assert pipeline.read_grades(work, own_db(work)).totals == grades.totals
    assert "Grades per student" in again.stdout and "ada_correct" in again.stdout


# ---------------------------------------------------------------------------- a broken submission
@pytest.mark.slow
def test_a_broken_notebook_is_recorded_with_a_reason(tmp_path, tmp_path_factory):
    root = fresh_course(tmp_path / "course", session_base(tmp_path_factory))
    a = min(GRADED, key=lambda x: len(pipeline.notebooks(x, REPO)))
    first = pipeline.notebooks(a, REPO, where="release")[0]
    (root / "submitted" / "zz_broken" / a).mkdir(parents=True)
    (root / "submitted" / "zz_broken" / a / f"{first}.ipynb").write_text("{ this is not json")
    run = pipeline.autograde_student(a, "zz_broken", root, db_url=own_db(root))
    assert not run.ok
    assert "JSON" in run.reason, run.reason


# ------------------------------------------------------------------------------- the whole class
@pytest.fixture(scope="module")
def klass(bundled_class_run):
    return bundled_class_run


@pytest.mark.slow
def test_every_bundled_submission_was_autograded(klass):
    expected = {tuple(x) for x in klass.collected.collected}
    assert {(r.student, r.assignment) for r in klass.runs} == expected
    bad = [(r.student, r.assignment, r.reason, r.log_tail[-1500:]) for r in klass.runs if not r.ok]
    assert not bad, bad
    assert set(klass.assignments) == set(GRADED)


@pytest.mark.slow
def test_generate_put_every_notebook_and_test_cell_in_the_gradebook(klass):
    for a in GRADED:
        layout = klass.grades.layout[a]
        assert sorted({nb for nb, *_ in layout}) == pipeline.notebooks(a, REPO)
        src_tests = set()
        for path in sorted((REPO / "source" / a).glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            src_tests |= {submissions.grade_id(c) for c in nb.cells if c.cell_type == "code"
                          and submissions.nbgrader_md(c).get("grade") and not submissions.is_solution(c)}
        assert set(klass.grades.tests(a)) == src_tests and src_tests


@pytest.mark.slow
def test_correct_submission_gets_the_maximum_on_every_autograded_test(klass):
    for a in GRADED:
        cells = klass.grades.by_cell(submissions.CORRECT, a)
        for gid in klass.grades.tests(a):
            c = cells[gid]
            assert c.score == c.max_score > 0, f"{a}/{c.notebook}/{gid}: {c.score} of {c.max_score}"
        manual = [c for c in cells.values() if c.kind == "manual"]
        assert all(c.needs_manual_grade for c in manual)


@pytest.mark.slow
def test_unchanged_release_gets_zero_everywhere_and_the_run_completes(klass):
    for a in GRADED:
        run = next(r for r in klass.runs if (r.student, r.assignment) == (submissions.UNCHANGED, a))
        assert run.ok, run.reason
        cells = klass.grades.by_cell(submissions.UNCHANGED, a)
        assert cells and all(c.score == 0 for c in cells.values()), {
            g: c.score for g, c in cells.items() if c.score != 0}
        assert klass.grades.totals[(submissions.UNCHANGED, a)][0] == 0


@pytest.mark.slow
def test_each_mistake_loses_exactly_its_targeted_tests_and_keeps_the_rest(klass):
    ms = autograde_mistakes()
    assert ms
    problems = []
    for sid, m in ms.items():
        cells = klass.grades.by_cell(sid, m.assignment)
        tests = klass.grades.tests(m.assignment)
        assert set(m.fails) <= set(tests), f"{m.name}: unknown test ids {set(m.fails) - set(tests)}"
        for gid in tests:
            c = cells[gid]
            want = 0 if gid in m.fails else c.max_score
            if c.score != want:
                problems.append(f"{sid} ({m.name}): {gid} scored {c.score}, expected {want}")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_each_mistake_is_told_what_is_wrong(klass):
    """Each test a mistake fails shows the student the recipe's diagnostic message (where it names one)."""
    problems, checked = [], 0
    for sid, m in autograde_mistakes().items():
        path = klass.root / "autograded" / sid / m.assignment / f"{m.notebook}.ipynb"
        nb = nbformat.read(path, as_version=4)
        for gid, message in m.messages.items():
            cell = next(c for c in nb.cells if submissions.grade_id(c) == gid)
            errors = [o for o in cell.outputs if o.get("output_type") == "error"]
            text = "\n".join(f"{o.get('ename')}: {o.get('evalue')}" for o in errors)
            checked += 1
            if message not in text:
                problems.append(f"{sid}: {gid} says {text[:300]!r}, expected {message!r}")
    assert checked >= len(autograde_mistakes()) // 2
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_harmless_stderr_in_test_cells_costs_no_points(klass):
    ex_noisy = submissions.noisy_student(len(mistakes()))
    noisy_assignments = sorted({a for (s, a) in klass.grades.totals if s == ex_noisy})
    assert noisy_assignments
    relabelled = 0
    for a in noisy_assignments:
        cells = klass.grades.by_cell(ex_noisy, a)
        for gid in klass.grades.tests(a):
            assert cells[gid].score == cells[gid].max_score, f"{a}/{gid}: {cells[gid].score}"
        for path in sorted((klass.root / "autograded" / ex_noisy / a).glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            for cell in nb.cells:
                md = submissions.nbgrader_md(cell)
                if md.get("grade") and cell.cell_type == "code":
                    # the judge decides test cells outside the kernel: nothing the kernel wrote, stderr
                    # included, reaches a graded cell (the relabelling step has its own test above)
                    assert [o.get("output_type") for o in cell.outputs] == [], (path.name, md["grade_id"])
                    relabelled += 1
    assert relabelled >= 2, "the noisy example has no judged test cell"


@pytest.mark.slow
def test_feedback_html_for_every_graded_submission_except_notebooks_awaiting_hand_grading(klass):
    held_any = 0
    for (sid, a) in klass.collected.collected:
        files = klass.feedback[a].get(sid, [])
        held = pipeline.held_feedback(a, klass.root, klass.db_url).get(sid, [])
        # held: exactly the notebooks with a written answer nobody has graded yet
        waiting = sorted({c.notebook for c in klass.grades.by_cell(sid, a).values() if c.score is None})
        assert held == waiting, (sid, a)
        held_any += len(held)
        assert sorted([p.stem for p in files] + held) == pipeline.notebooks(a, REPO, where="release"), (sid, a)
        for p in files:
            html = p.read_text(encoding="utf-8")
            assert "<html" in html.lower() and "Score" in html
    assert held_any > 0  # the bundled class has written answers, so some feedback waits


@pytest.mark.slow
def test_csv_export_has_one_row_per_student_and_assignment(klass):
    with open(klass.csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    students = {s for (s, _) in klass.collected.collected}
    pairs = [(r["student_id"], r["assignment"]) for r in rows]
    assert len(pairs) == len(set(pairs)) == len(students) * len(GRADED)
    assert set(pairs) == {(s, a) for s in students for a in GRADED}
    for r in rows:
        key = (r["student_id"], r["assignment"])
        if key in klass.grades.totals:
            assert float(r["score"]) == klass.grades.totals[key][0]
            assert float(r["max_score"]) == klass.grades.totals[key][1]
        else:
            assert float(r["score"]) == 0.0


@pytest.mark.slow
def test_report_and_tables_name_every_student(klass):
    report = json.loads((klass.root / pipeline.REPORT_NAME).read_text())
    assert len(report["runs"]) == len(klass.runs)
    table = pipeline.format_tables(klass.grades, klass.runs)
    for sid in {s for (s, _) in klass.collected.collected}:
        assert sid in table
    for a in GRADED:
        for gid in klass.grades.tests(a):
            assert gid in table
