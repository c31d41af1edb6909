"""Grading that can be trusted (issue 5): hostile and broken submissions, timeouts, re-runs, nothing lost.

Fast tests (no nbgrader run): the committed hostile cases are in sync with their generator, the
pre-flight raises no blocking finding on the bundled example class, reports every malformed case,
repairs what nbgrader would refuse (duplicated locked cells, edited locked metadata, changed cell
types), moves links and FIFOs out without following them, rejects only the folder names nbgrader
cannot address, the feedback filter
removes hidden-test code but keeps the failure message, the kernel limits are wired in
``nbgrader_config.py`` and hold in a started process, and ``release/`` holds no hidden-test line.

Slow tests grade for real:

* ``hostile_run`` (module scope): every case of ``examples/hostile`` through collect -> integrity
  pre-flight -> ``nbgrader autograde`` (one process per student) -> integrity overrides ->
  ``generate_feedback`` -> export, in a private copy of the course. Each case is then checked
  against its expectations (``hostile.verdict``): the autograder's own score, the final score,
  the integrity findings and the runtime defence's message. The students are fanned out on the
  parallel command's Dask grader (``RLHF_TRUST_WORKERS``, default 2; 0 = the sequential loop),
  while ``docs/trust_report.md`` comes from the sequential loop: the report test proves both
  paths treat every case the same.
* the bundled example class (``bundled_class_run``, graded once per session by course_support) is
  graded a second time from scratch in a fresh course copy; that run is killed after two students
  (every process of it, SIGKILL), the grades already written are checked, the run is resumed (it
  grades only what is missing) and the final grades must equal the first run's, cell by cell.
  The second run covers ``a1_ppo_objective`` for the first ``RLHF_TRUST_REGRADE_STUDENTS`` (default 4)
  students by id; ``RLHF_TRUST_FULL_CLASS=1`` makes it cover both assignments of those students.
"""
from __future__ import annotations

import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pytest

from course_support import (  # noqa: F401  (fixtures are used by name)
    REPO, bundled_class_run, course_template_dir, fresh_course, kill_tree, load_module, session_base,
)
from fixtures import hostile
from rlhf_lab.instructor.operations import backup
from rlhf_lab.instructor.grader import feedback_filter, integrity, kernel_guard
from rlhf_lab.instructor.classrun import pipeline

HOSTILE = REPO / "examples" / "hostile"
CASES = hostile.load_cases(HOSTILE)
CASE_IDS = [c.student for c in CASES]
CELL_TIMEOUT = "30"  # seconds per cell for the hostile class (its honest cells take < 5 s)


# ============================================================================ fast: static checks
def test_committed_hostile_cases_equal_a_fresh_build():
    diff = hostile.cases_diff(REPO)
    assert not diff, f"examples/hostile is stale (run tools/make_hostile.py): {diff[:10]}"


def _trust_report_tool():
    return load_module(REPO / "tools" / "trust_report.py", "trust_report")


def test_readme_trust_table_is_the_committed_report_table():
    """README.md shows the hostile-case table of docs/trust_report.md (tools/trust_report.py writes both)"""
    tool = _trust_report_tool()
    readme = tool.table_in((REPO / "README.md").read_text(encoding="utf-8"))
    report = tool.table_in((REPO / "docs" / "trust_report.md").read_text(encoding="utf-8"))
    assert len(report) == len(CASES) + 2, "docs/trust_report.md lists other cases: run tools/trust_report.py"
    assert readme == report, "README.md's trust table differs from docs/trust_report.md: run tools/trust_report.py"


def test_no_false_alarm_on_the_bundled_example_class():
    """Correct, unchanged, noisy and classic-mistake submissions raise no blocking finding."""
    subs = REPO / "examples" / "submissions"
    checked = 0
    for folder in sorted(p for p in subs.glob("*/*") if p.is_dir()):
        student, assignment = folder.parent.name, folder.name
        specs = integrity.release_specs(REPO, assignment)
        checker = integrity._Checker(REPO, assignment, specs, {}, quarantine=False)
        for path in sorted(folder.glob("*.ipynb")):
            nb = nbformat.read(str(path), as_version=4)
            findings = checker.check_notebook(student, path.name, nb)
            blocking = [f.text() for f in findings if f.blocking]
            assert not blocking, blocking
            checked += 1
    assert checked >= 10


def test_duplicated_cells_and_changed_types_are_repaired_and_the_rest_is_graded():
    """A copied locked cell (nbgrader would refuse the notebook), a copied answer, a cell saved as
    markdown or raw, a locked cell whose metadata was edited: the pre-flight names each cell and its
    problem, withholds nothing, and repairs the notebook into the release's structure."""
    import copy as _copy

    from fixtures import submissions

    nb = submissions.correct_submission("a1_ppo_objective", REPO)[hostile.NB]
    specs = integrity.release_specs(REPO, "a1_ppo_objective")
    spec = specs[hostile.NB_FILE]
    checker = integrity._Checker(REPO, "a1_ppo_objective", specs, {}, quarantine=False)
    idx = {c.metadata.get("nbgrader", {}).get("grade_id"): i for i, c in enumerate(nb.cells)}

    def structure(notebook):
        return [(c.cell_type, c.metadata.get("nbgrader", {}).get("grade_id"),
                 c.metadata.get("nbgrader", {}).get("locked")) for c in notebook.cells
                if c.metadata.get("nbgrader", {}).get("grade_id")]

    release = nbformat.read(str(REPO / "release" / "a1_ppo_objective" / hostile.NB_FILE), as_version=4)
    want = structure(release)

    def copied(gid, where):
        out = _copy.deepcopy(nb)
        cell = _copy.deepcopy(out.cells[idx[gid]])
        cell["id"] = "copy-of-" + gid
        out.cells.insert(where, cell)
        return out

    broken = {
        "duplicate-answer": copied("ppo_surrogate", idx["ppo_surrogate"] + 1),
        "duplicate-cell": copied("test_ppo_surrogate", idx["test_surrogate_table"]),
    }
    md = _copy.deepcopy(nb)
    md.cells[idx["surrogate_table"]] = integrity._with_type(md.cells[idx["surrogate_table"]], "markdown")
    broken["cell-type"] = md
    meta = _copy.deepcopy(nb)
    meta.cells[idx["test_surrogate_table"]].metadata["nbgrader"]["grade"] = False
    broken["edited-metadata"] = meta
    for code, notebook in broken.items():
        found = checker.check_notebook("s", hostile.NB_FILE, notebook)
        mine = [f for f in found if f.code == code]
        assert mine, (code, [f.text() for f in found])
        assert not [f for f in found if f.blocking], [f.text() for f in found if f.blocking]
        assert mine[0].grade_id and mine[0].grade_id in mine[0].message and mine[0].cell is not None
        repaired, repairs = checker.repair_notebook("s", hostile.NB_FILE, notebook)
        assert code in repairs
        assert structure(repaired) == want, code
        assert [f for f in checker.check_notebook("s", hostile.NB_FILE, repaired) if f.code == code] == []
    # the duplicated locked cell keeps its first copy (where the release has it)
    rep, _ = checker.repair_notebook("s", hostile.NB_FILE, broken["duplicate-cell"])
    assert [c.get("id") for c in rep.cells].count("copy-of-test_ppo_surrogate") == 0
    assert spec.by_id("test_ppo_surrogate") is not None


def test_a_display_magic_above_the_first_locked_cell_only_warns():
    from fixtures import submissions

    nb = submissions.correct_submission("a1_ppo_objective", REPO)[hostile.NB]
    specs = integrity.release_specs(REPO, "a1_ppo_objective")
    checker = integrity._Checker(REPO, "a1_ppo_objective", specs, {}, quarantine=False)
    for source, code in (("%matplotlib widget", "magic-before-start"), ("x = 1", "code-before-start")):
        top = nbformat.v4.new_code_cell(source)
        top["id"] = "top-cell"
        nb2 = nbformat.from_dict({**nb, "cells": [top] + list(nb.cells)})
        found = checker.check_notebook("s", hostile.NB_FILE, nb2)
        assert code in {f.code for f in found}
        assert not [f for f in found if f.blocking or f.withhold]


def test_symlinks_and_fifos_are_moved_out_as_they_are_never_followed(tmp_path):
    root = pipeline.copy_course(tmp_path / "course", REPO)
    folder = root / "submitted" / "s1" / "a1_ppo_objective"
    folder.mkdir(parents=True)
    shutil.copyfile(HOSTILE / "h00_control_correct" / "a1_ppo_objective" / hostile.NB_FILE, folder / hostile.NB_FILE)
    secret = tmp_path / "secret.txt"
    secret.write_text("instructor only")
    os.symlink(secret, folder / "notes.txt")
    os.symlink(root / "source", folder / "src")
    os.mkfifo(folder / "pipe")
    report = integrity.preflight("a1_ppo_objective", root, ["s1"])
    codes = [(f.code, f.notebook) for f in report.for_student("s1")]
    assert ("symlink", "notes.txt") in codes and ("symlink", "src") in codes and ("special-file", "pipe") in codes
    assert not [f for f in report.blocking("s1") if f.notebook == hostile.NB_FILE]
    left = sorted(p.name for p in folder.iterdir())
    assert left == [hostile.NB_FILE], left
    q = root / integrity.QUARANTINE / "s1" / "a1_ppo_objective"
    assert (q / "notes.txt").is_symlink() and (q / "src").is_symlink()  # moved as links
    assert secret.read_text() == "instructor only" and (root / "source" / "a1_ppo_objective").is_dir()


@pytest.mark.parametrize("name, usable", [
    ("doe, jane", True), ("o'neil \"jr\"", True), ("zoë ångström", True),
    ("new\nline", False), ("bad\udcffbyte", False), ("star*", False), (".hidden", False),
])
def test_student_folder_names_graded_or_rejected_alone_and_named_readably(name, usable):
    assert (integrity._unusable_name(name) == "") is usable
    shown = integrity.readable_name(name)
    assert "\n" not in shown and shown.isprintable()
    shown.encode("utf-8")  # printable in any log or report


@pytest.fixture(scope="module")
def preflight_course(tmp_path_factory):
    """A course copy with the hostile class collected into submitted/ and the pre-flight run (no nbgrader)."""
    root = pipeline.copy_course(tmp_path_factory.mktemp("preflight") / "course", REPO)
    subs = hostile.copy_cases(root)
    names = sorted({c.assignment for c in CASES})
    pipeline.collect(subs, root, names)
    return root, {a: integrity.preflight(a, root) for a in names}


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_preflight_reports_each_case(preflight_course, case):
    root, reports = preflight_course
    found = reports[case.assignment].for_student(case.student)
    codes = {f.code for f in found}
    assert set(case.findings) <= codes, (case.findings, [f.text() for f in found])
    for f in found:  # every finding names the student and says what is wrong, in words
        assert f.student == case.student and f.assignment == case.assignment and len(f.message) > 20
        if f.code not in ("missing-notebook", "student-id-characters", "extra-file", "renamed-notebook",
                          "unknown-notebook", "other-assignment", "invalid-notebook", "shadow-module", "symlink",
                          "special-file", "file-name"):
            assert f.notebook and (f.cell is not None or f.grade_id or f.code == "kernel-name"), f
    blocking = {f.code for f in found if f.blocking} - {"missing-notebook"}
    if not case.zero or set(case.full) == set(hostile.ALL_TESTS):
        assert not blocking, f"an honest case was blocked: {blocking}"


def test_preflight_quarantines_what_must_not_run_and_remembers_why(preflight_course):
    root, reports = preflight_course
    q = root / integrity.QUARANTINE
    assert (q / "h24_invalid_json" / "a1_ppo_objective" / hostile.NB_FILE).exists()
    assert (q / "h23_other_assignment" / "a1_ppo_objective" / hostile.NB_FILE).exists()
    assert (q / "h28_shadow_module" / "a1_ppo_objective" / "numpy.py").exists()
    assert (q / "h69_symlinks" / "a1_ppo_objective" / "source").is_symlink()
    assert sorted(p.name for p in (root / "submitted" / "h69_symlinks" / "a1_ppo_objective").iterdir()) == \
        [hostile.NB_FILE]
    # a notebook nbgrader would refuse (duplicated locked cell) is repaired in place, the original kept
    assert (q / "h62_duplicated_locked_cell" / "a1_ppo_objective" / (hostile.NB_FILE + ".before-repair")).exists()
    assert not (root / "submitted" / "h28_shadow_module" / "a1_ppo_objective" / "numpy.py").exists()
    assert (root / "submitted" / "h28_shadow_module" / "a1_ppo_objective" / hostile.NB_FILE).exists()
    # a second pre-flight (the file is gone from submitted/) reports the same problem again
    again = integrity.preflight("a1_ppo_objective", root, ["h24_invalid_json"])
    assert "invalid-notebook" in {f.code for f in again.findings}
    saved = json.loads((root / integrity.REPORT_TEMPLATE.format(assignment="a1_ppo_objective")).read_text(encoding="utf-8"))
    assert saved["assignment"] == "a1_ppo_objective" and saved["findings"]


# =========================================================================== fast: feedback filter
def _failing_test_cell():
    """A real test cell from source/ with the error output a failing hidden check produces."""
    nb = nbformat.read(str(REPO / "source" / "a1_ppo_objective" / "01_clipped_objective.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_ppo_surrogate")
    lines, hidden = feedback_filter.split_hidden(cell.source)
    hidden_line_no = sorted(n for n in hidden if lines[n - 1].strip() and "HIDDEN" not in lines[n - 1])[0]
    context = "\n".join(f"     {n} {lines[n - 1]}" for n in range(max(1, hidden_line_no - 3), hidden_line_no + 2))
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="checking ppo_surrogate\n"),
        nbformat.v4.new_output("error", ename="GradingError",
                               evalue="ppo_surrogate on fresh random inputs: expected [1.2], got [0.8]",
                               traceback=["\x1b[31m---------------------------------------------\x1b[39m",
                                          f"Cell In[7], line {hidden_line_no}\n{context}",
                                          "File grading.py:300, in close(actual, expected, what)",
                                          "\x1b[31mGradingError\x1b[39m: ppo_surrogate on fresh random inputs"]),
    ]
    return nb, cell, lines, hidden


def test_feedback_filter_removes_hidden_code_and_keeps_the_failure_message():
    nb, cell, lines, hidden = _failing_test_cell()
    secret = [lines[n - 1].strip() for n in hidden if len(lines[n - 1].strip()) >= 12 and "HIDDEN" not in lines[n - 1]]
    assert secret and any(s in "".join(cell.outputs[1]["traceback"]) for s in secret)  # the raw traceback leaks
    out, res = feedback_filter.HideHiddenTests().preprocess(nb, {})
    cell = next(c for c in out.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_ppo_surrogate")
    text = cell.source + json.dumps(cell.outputs)
    assert not [s for s in secret if s in text]
    assert "BEGIN HIDDEN" not in text and "hidden tests:" in cell.source
    tb = cell.outputs[1]["traceback"]
    assert tb[0] == "Hidden test failed"
    assert "ppo_surrogate on fresh random inputs: expected [1.2], got [0.8]" in tb[1]
    assert cell.outputs[0]["text"] == "checking ppo_surrogate\n"
    assert "np.testing.assert_allclose" in cell.source  # the visible checks stay
    # a failure in the visible part says which line failed, without quoting hidden code
    visible_line = next(n for n in range(1, len(lines) + 1) if n not in hidden and "assert_allclose" in lines[n - 1])
    summary = feedback_filter.summarise_error(
        {"output_type": "error", "ename": "AssertionError", "evalue": "Not equal",
         "traceback": [f"Cell In[3], line {visible_line}\n" + "\n".join(lines)]}, lines, hidden)
    assert summary["traceback"][0].startswith(f"Visible check failed at line {visible_line}: np.testing")
    assert not [s for s in secret if s in json.dumps(summary)]


def test_release_holds_no_hidden_test_line():
    secrets = feedback_filter.hidden_lines(REPO / "source")
    assert len(secrets) >= 28  # one judge line per test cell
    checked = 0
    for path in sorted((REPO / "release").rglob("*.ipynb")):
        text = path.read_text(encoding="utf-8")
        body = json.dumps([c.get("source") for c in json.loads(text)["cells"]])
        assert "BEGIN HIDDEN TESTS" not in text, path
        leaked = [s for s in secrets if json.dumps(s)[1:-1] in body]
        assert not leaked, (path, leaked[:3])
        checked += 1
    assert checked >= 6


# ============================================================================ fast: kernel limits
def test_nbgrader_config_wires_the_kernel_guard_and_the_feedback_filter():
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(REPO)).load_config()
    first = cfg.Autograde.autograde_preprocessors[0]
    assert first.__name__ == "Execute" and issubclass(first, kernel_guard._NbgraderExecute)
    assert first.__module__ != "nbgrader.preprocessors.execute"  # the guarded drop-in, not nbgrader's own
    assert "JudgeCells" in [k.__name__ for k in first.mro()]  # hidden tests are decided by the judge
    names = [p.__name__ for p in cfg.GenerateFeedback.preprocessors]
    assert names[:3] == ["GetGrades", "HideHiddenTests", "CSSHTMLHeaderPreprocessor"]
    assert pipeline.check_config(REPO)["autograde_preprocessors"][0] == "Execute"


def test_kernel_limits_hold_in_the_started_process():
    probe = ("import resource, numpy as np\n"
             "print(resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_FSIZE))\n"
             "try:\n    np.ones(2**31)\nexcept MemoryError:\n    print('MemoryError')\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         preexec_fn=kernel_guard.limits_preexec(2048, 64))
    mib = 1024 * 1024
    assert out.stdout.splitlines() == [f"({2048 * mib}, {2048 * mib}) ({64 * mib}, {64 * mib})", "MemoryError"], out
    assert resource.getrlimit(resource.RLIMIT_AS)[0] != 2048 * mib  # this process is untouched


# ============================================================================= slow: hostile class
@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """Every hostile case graded for real in a private course copy (see the module docstring)."""
    base = session_base(tmp_path_factory)
    root = fresh_course(tmp_path_factory.mktemp("trust") / "hostile_course", base)
    saved = {k: os.environ.get(k) for k in ("RLHF_CELL_TIMEOUT", "RLHF_KERNEL_MEMORY_MB")}
    os.environ["RLHF_CELL_TIMEOUT"] = CELL_TIMEOUT
    os.environ["RLHF_KERNEL_MEMORY_MB"] = "4096"
    grader = None
    workers = int(os.environ.get("RLHF_TRUST_WORKERS", "2") or 0)
    if workers > 1:
        from rlhf_lab.instructor.classrun import parallel

        grader = parallel.dask_grader(workers=workers)
    started = time.perf_counter()
    try:
        run = hostile.run_hostile_class(root, grader=grader, cases=CASES)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    print(f"\n[hostile] {len(CASES)} cases graded in {time.perf_counter() - started:.0f} s "
          f"({'sequential' if workers <= 1 else f'{workers} Dask workers'}; stages: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in run.seconds.items() if isinstance(v, (int, float))) + ")",
          flush=True)
    return run


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_hostile_case_is_graded_as_expected(hostile_run, case):
    v = hostile.verdict(case, hostile_run)
    assert v.ok, f"{case.student} ({case.title}):\n  " + "\n  ".join(v.problems) + f"\n  did: {v.action()}"


@pytest.mark.slow
def test_committed_trust_report_says_what_the_grader_does_now(hostile_run):
    """docs/trust_report.md's case table, rendered again from this run of the hostile class, is unchanged
    (up to the numbers drawn fresh by the hidden tests)"""
    import re

    def masked(rows):  # the hidden tests draw fresh inputs every run: their numbers in messages vary
        return [re.sub(r"-?\d+\.\d+(e[-+]?\d+)?", "<x>", row) for row in rows]

    tool = _trust_report_tool()
    now = masked(tool.case_table(CASES, [hostile.verdict(c, hostile_run) for c in CASES]))
    committed = masked(tool.table_in((REPO / "docs" / "trust_report.md").read_text(encoding="utf-8")))
    changed = [(old, new) for old, new in zip(committed, now) if old != new]
    assert now == committed, "docs/trust_report.md is stale (run tools/trust_report.py):\n" + "\n".join(
        f"- {old}\n+ {new}" for old, new in changed[:5])


@pytest.mark.slow
def test_one_bad_submission_never_costs_another_student(hostile_run):
    """Every student nbgrader can read was autograded to the end; kernel killers did not stop the run."""
    order = [r.student for r in hostile_run.runs]
    for case in CASES:
        run = hostile_run.run_of(case.student, case.assignment)
        if case.ungraded:
            assert run is None or not run.ok  # nothing gradable: recorded, not crashed
            continue
        assert run is not None and run.ok, (case.student, run and run.reason)
    for killer in ("h13_os_exit", "h18_infinite_loop", "h19_loop_ignoring_interrupt", "h20_huge_memory"):
        nxt = order[order.index(killer) + 1]
        after = next(c for c in CASES if c.student == nxt)
        assert hostile.verdict(after, hostile_run).ok, f"{nxt}, graded right after {killer}"
    assert hostile_run.grades.totals[("h00_control_correct", "a1_ppo_objective")][0] >= 15


@pytest.mark.slow
def test_every_withheld_grade_has_a_recorded_reason(hostile_run):
    from nbgrader.api import Gradebook

    report = json.loads((hostile_run.root / integrity.REPORT_TEMPLATE.format(assignment="a1_ppo_objective"))
                        .read_text(encoding="utf-8"))
    by_student = {}
    for f in report["findings"]:
        by_student.setdefault(f["student"], []).append(f)
    overridden = {(o.student, o.notebook, o.grade_id) for o in hostile_run.overrides}
    with Gradebook(hostile_run.db_url, pipeline.COURSE_ID) as gb:
        for case in CASES:
            if case.assignment != "a1_ppo_objective" or not case.zero or case.student == "h14_hard_coded":
                continue
            if set(case.zero) <= set(case.auto_zero):
                continue  # the hidden tests alone gave 0; no override needed
            assert case.student in by_student, case.student
            snb = gb.find_submission_notebook(hostile.NB, "a1_ppo_objective", case.student)
            assert snb.flagged, case.student
            comments = " ".join(c.comment or "" for c in snb.comments)
            assert integrity.COMMENT_TAG in comments and case.student in comments, (case.student, comments)
            for key in case.zero:
                nb, gid = key.split("/")
                if (case.student, nb, gid) not in overridden:
                    assert gb.find_grade(gid, nb, "a1_ppo_objective", case.student).auto_score == 0, key
    csv_rows = list(csv.DictReader(open(hostile_run.csv_path, newline="", encoding="utf-8")))
    students = {r["student_id"] for r in csv_rows if r["assignment"] == "a1_ppo_objective"}
    assert {c.student for c in CASES if c.assignment == "a1_ppo_objective"} <= students  # nobody silently dropped


@pytest.mark.slow
def test_feedback_names_the_failed_checks_without_the_hidden_tests(hostile_run):
    leaks = feedback_filter.check_feedback(hostile_run.root / "feedback", hostile_run.root / "source")
    assert not leaks, leaks
    fb = hostile_run.root / "feedback"
    html = feedback_filter.html_text(fb / "h14_hard_coded" / "a1_ppo_objective" / f"{hostile.NB}.html")
    # which check failed, and why: the judge's verdict, named as the test cell's failure
    words = " ".join(html.split())
    assert "The test cell failed GradingError: surrogate_table must return" in words and "fresh inputs" in words
    # a patched np.testing decides nothing under the judge: the page gives the judge's verdict on the
    # student's actual answer (the signed min dropped), not a grade the patch produced
    words = " ".join(feedback_filter.html_text(fb / "h04_patch_np_testing" / "a1_ppo_objective" / f"{hostile.NB}.html").split())
    assert "GradingError: ppo_surrogate: Clipped the ratio but dropped the signed min" in words
    # a blocking pre-flight finding reaches the student as the withheld cell's comment, in words
    words = " ".join(feedback_filter.html_text(fb / "h02_test_cell_deleted" / "a1_ppo_objective" / f"{hostile.NB}.html").split())
    assert f"{integrity.COMMENT_TAG} Points withheld for instructor review" in words
    assert "'test_ppo_surrogate' was deleted" in words
    n = len(list(fb.rglob("*.html")))
    assert n >= len([c for c in CASES if not c.ungraded])


@pytest.mark.slow
def test_plain_nbgrader_feedback_would_leak_the_hidden_tests(hostile_run, tmp_path):
    """The leak check can fail: without the filter, nbgrader's own feedback contains hidden lines."""
    root = hostile_run.root
    student = "h14_hard_coded"
    out = pipeline.run_nbgrader(["generate_feedback", "a1_ppo_objective", "--student", student, "--force",
                                 "--GenerateFeedback.preprocessors=['nbgrader.preprocessors.GetGrades']",
                                 f"--CourseDirectory.feedback_directory=plain_feedback"], root)
    assert out.ok, out.output[-2000:]
    html = root / "plain_feedback" / student / "a1_ppo_objective" / f"{hostile.NB}.html"
    secrets = feedback_filter.hidden_lines(root / "source")
    assert feedback_filter.leaked_lines(html, secrets)


@pytest.mark.slow
def test_gradebook_backup_and_export_trace_every_grade_to_a_test_cell(hostile_run, tmp_path):
    root = hostile_run.root
    folder = backup.backup(root, hostile_run.db_url, tmp_path / "bk")
    assert backup.verify_backup(folder, root) == []
    rows = list(csv.DictReader(open(folder / "grades_by_cell.csv", newline="", encoding="utf-8")))
    graded = {(c.student, c.assignment, c.grade_id) for c in hostile_run.grades.cells}
    assert {(r["student"], r["assignment"], r["grade_id"]) for r in rows} == graded
    for r in rows:
        if r["kind"] == "test" and r["autograded_index"] != "":
            nb = nbformat.read(str(root / r["autograded_file"]), as_version=4)
            assert nb.cells[int(r["autograded_index"])].metadata["nbgrader"]["grade_id"] == r["grade_id"]
    # withheld points are visible as such: the manual override 0 and the flag, beside whatever the
    # autograder gave (a deleted test cell was never run, so it has no auto score of its own)
    row = next(r for r in rows if r["student"] == "h02_test_cell_deleted" and r["grade_id"] == "test_ppo_surrogate")
    assert row["manual_score"] != "" and float(row["manual_score"]) == 0.0 and row["flagged"] == "True", row
    assert float(row["auto_score"] or 0) == 0.0, row
    # an honest notebook is neither overridden nor flagged
    row = next(r for r in rows if r["student"] == "h28_shadow_module" and r["grade_id"] == "test_ppo_surrogate")
    assert float(row["auto_score"]) == 6.0 and row["manual_score"] == "" and row["flagged"] == "False", row
    # tampering with the copy is detected; restoring the snapshot gives back the same gradebook
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    with open(broken / "grades.csv", "a", encoding="utf-8") as fh:
        fh.write("a1_ppo_objective,,,intruder,,,,99,0,99,18\n")
    assert backup.verify_backup(broken, root)
    live = backup.sqlite_file(hostile_run.db_url)
    scratch = tmp_path / "restored.db"
    shutil.copy2(live, scratch)
    url = "sqlite:///" + str(scratch)
    from nbgrader.api import Gradebook

    with Gradebook(url, pipeline.COURSE_ID) as gb:
        gb.find_grade("test_ppo_surrogate", hostile.NB, "a1_ppo_objective", "h00_control_correct").manual_score = 1.0
        gb.db.commit()
    backup.restore(folder, root, url)
    assert backup.cell_rows(url, pipeline.COURSE_ID, root) == backup.cell_rows(hostile_run.db_url, pipeline.COURSE_ID, root)


@pytest.mark.slow
def test_regrading_the_hardest_hostile_cases_gives_identical_grades(hostile_run):
    """Timeouts, kernel deaths, the memory limit, tampering: a second autograde gives the same grades."""
    again = ["h00_control_correct", "h04_patch_np_testing", "h13_os_exit", "h20_huge_memory"]
    before = {k: v for k, v in _cell_scores(hostile_run.root, hostile_run.db_url).items() if k[0] in again}
    saved = os.environ.get("RLHF_CELL_TIMEOUT")
    os.environ["RLHF_CELL_TIMEOUT"] = CELL_TIMEOUT
    try:
        runs = pipeline.autograde("a1_ppo_objective", again, hostile_run.root, hostile_run.db_url, force=True)
    finally:
        os.environ.pop("RLHF_CELL_TIMEOUT") if saved is None else os.environ.__setitem__("RLHF_CELL_TIMEOUT", saved)
    assert all(r.ok for r in runs), [(r.student, r.reason) for r in runs]
    report = integrity.preflight("a1_ppo_objective", hostile_run.root, again)
    integrity.apply_overrides(report, hostile_run.root, hostile_run.db_url)
    after = {k: v for k, v in _cell_scores(hostile_run.root, hostile_run.db_url).items() if k[0] in again}
    assert after == before and len(before) >= 4 * 5


@pytest.mark.postgres
def test_backup_of_a_postgresql_gradebook_uses_pg_dump_and_restores(tmp_path):
    """The same command on a PostgreSQL gradebook: pg_dump snapshot, CSVs that trace, pg_restore."""
    from nbgrader.api import Gradebook
    from nbgrader.utils import compute_checksum
    from pg_support import create_database, postgres_server

    root = pipeline.copy_course(tmp_path / "course", REPO, include=("nbgrader_config.py", "source", "release"))
    src = nbformat.read(str(root / "source" / "a1_ppo_objective" / f"{hostile.NB}.ipynb"), as_version=4)
    tests = [(i, c) for i, c in enumerate(src.cells)
             if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")]
    with postgres_server() as server:
        url = backup.sqlalchemy_url(create_database(server, "grades"))
        with Gradebook(url, pipeline.COURSE_ID) as gb:  # what generate_assignment + autograde record
            gb.update_or_create_assignment("a1_ppo_objective")
            gb.add_notebook(hostile.NB, "a1_ppo_objective")
            for _, cell in tests:
                md = cell.metadata["nbgrader"]
                gb.add_grade_cell(md["grade_id"], hostile.NB, "a1_ppo_objective", max_score=md["points"], cell_type="code")
                gb.add_source_cell(md["grade_id"], hostile.NB, "a1_ppo_objective", cell_type="code",
                                   locked=True, source=cell.source, checksum=compute_checksum(cell))
            gb.add_student("ana")
            gb.add_submission("a1_ppo_objective", "ana")
            for n, (_, cell) in enumerate(tests):
                g = gb.find_grade(cell.metadata["nbgrader"]["grade_id"], hostile.NB, "a1_ppo_objective", "ana")
                g.auto_score = float(cell.metadata["nbgrader"]["points"]) if n % 2 == 0 else 0.0
            gb.db.commit()
        folder = backup.backup(root, url, tmp_path / "bk")
        assert (folder / "gradebook.pgdump").stat().st_size > 1000
        assert backup.verify_backup(folder, root) == []
        rows = list(csv.DictReader(open(folder / "grades_by_cell.csv", newline="", encoding="utf-8")))
        assert [int(r["source_index"]) for r in rows] == [i for i, _ in tests]
        manifest = json.loads((folder / "MANIFEST.json").read_text())
        assert manifest["snapshot"] == "gradebook.pgdump" and manifest["gradebook"].startswith("postgresql")
        assert backup.redact("postgresql://grader:s3cret@host/db") == "postgresql://grader:***@host/db"
        wanted = backup.cell_rows(url, pipeline.COURSE_ID, root)
        with Gradebook(url, pipeline.COURSE_ID) as gb:
            gb.find_grade(tests[0][1].metadata["nbgrader"]["grade_id"], hostile.NB, "a1_ppo_objective",
                          "ana").manual_score = 0.0
            gb.db.commit()
        assert backup.cell_rows(url, pipeline.COURSE_ID, root) != wanted
        backup.restore(folder, root, url)
        assert backup.cell_rows(url, pipeline.COURSE_ID, root) == wanted


def test_backup_command_is_one_documented_command():
    doc = backup.__doc__
    assert "python -m rlhf_lab.instructor.operations.backup" in doc
    out = subprocess.run([sys.executable, "-m", "rlhf_lab.instructor.operations.backup", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "--verify" in out.stdout and "--restore" in out.stdout


# ==================================================== slow: the bundled class twice, killed partway
DRIVER = textwrap.dedent("""
    import sys
    from rlhf_lab.instructor.classrun import pipeline
    root, force, names, subs = sys.argv[1], sys.argv[2] == "force", sys.argv[3].split(","), sys.argv[4]
    def progress(run):
        print("DONE", run.student, run.assignment, run.ok, flush=True)
    pipeline.run_class(subs, root=root, names=names, fresh=False, regenerate=False,
                       force=force, progress=progress)
    print("FINISHED", flush=True)
""")
#: What the second class run regrades. The whole bundled class (both assignments) with
#: RLHF_TRUST_FULL_CLASS=1; by default a1_ppo_objective, every student who submitted it (the a2_ppo_rlhf
#: grades of the first run must then survive untouched as well), to keep the suite's runtime sane
#: on a 2-core machine.
REGRADE = (["a1_ppo_objective", "a2_ppo_rlhf"] if os.environ.get("RLHF_TRUST_FULL_CLASS") == "1"
           else ["a1_ppo_objective"])
#: How many students (sorted by id, of those who submitted REGRADE[0]) the second run regrades:
#: enough that the kill after two leaves work to resume, few enough to keep the test near 100 s.
REGRADE_STUDENTS = int(os.environ.get("RLHF_TRUST_REGRADE_STUDENTS", "4"))


def _cell_scores(root: Path, db_url: str) -> dict:
    g = pipeline.read_grades(root, db_url)
    return {(c.student, c.assignment, c.notebook, c.grade_id): c.score for c in g.cells}


@pytest.mark.slow
def test_class_graded_again_killed_partway_and_resumed_gives_identical_grades(bundled_class_run, tmp_path,
                                                                             tmp_path_factory):
    """The bundled class graded a second time from scratch: the run is killed (every process of it)
    after two students, nothing written is lost, a re-run grades only what is missing, and the
    final grades equal the first run's cell by cell."""
    every = sorted({c.student for c in bundled_class_run.grades.cells if c.assignment == REGRADE[0]})
    subset = every[:REGRADE_STUDENTS]  # the kill after two students still leaves some to resume
    assert len(subset) == REGRADE_STUDENTS, every
    first = {(c.student, c.assignment, c.notebook, c.grade_id): c.score
             for c in bundled_class_run.grades.cells if c.assignment in REGRADE and c.student in subset}
    pairs = sorted({(k[0], k[1]) for k in first})
    assert len(pairs) >= REGRADE_STUDENTS
    root = fresh_course(tmp_path / "second_run", session_base(tmp_path_factory))  # empty gradebook
    subs = tmp_path / "subset_submissions"
    for student, assignment in pairs:
        shutil.copytree(root / "examples" / "submissions" / student / assignment, subs / student / assignment)
    db_url = "sqlite:///" + str(root / "gradebook.db")
    env = pipeline.nbgrader_env(root, db_url)
    started = time.perf_counter()
    log = open(tmp_path / "killed_run.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(root), "resume", ",".join(REGRADE), str(subs)],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    done = []
    try:
        deadline = time.monotonic() + 3600
        while len(done) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("DONE") and line.split()[3] == "True":
                done.append(tuple(line.split()[1:3]))
        assert len(done) >= 2, "the class run did not get going"
        time.sleep(6)  # let the next student's nbgrader get into the middle of its notebooks
        assert proc.poll() is None, "the class run finished before it could be killed"
    finally:
        killed = kill_tree(proc)
        log.close()
    # a student may have finished during the sleep: its DONE line is still in the pipe, or was never
    # printed (the kill came between nbgrader writing its last notebook and the driver's print)
    # The kill reaches nbgrader before the driver, which may still report that student as failed
    # (exit -9): only a success counts as done
    done += [tuple(line.split()[1:3]) for line in proc.stdout.read().splitlines()
             if line.startswith("DONE") and line.split()[3] == "True"]
    assert killed >= 2  # the driver and at least the nbgrader it had started
    # what the gradebook and autograded/ say is finished (what a re-run will skip)
    finished = {(s, a) for (s, a) in pairs if s not in set(pipeline.pending(a, root, db_url))}
    assert set(done) <= finished, ("reported done but not recorded as finished", set(done) - finished)
    assert finished != set(pairs), "the kill came after the last student: nothing left to resume"
    at_kill = _cell_scores(root, db_url)
    for key, score in first.items():  # every grade of a finished student is there before the re-run, and right
        if (key[0], key[1]) in finished:
            assert at_kill.get(key) == score, (key, score, at_kill.get(key))

    resumed = subprocess.run([sys.executable, "-c", DRIVER, str(root), "resume", ",".join(REGRADE), str(subs)],
                             cwd=root, env=env, capture_output=True, text=True, timeout=7200)
    assert "FINISHED" in resumed.stdout, resumed.stderr[-3000:]
    regraded = {tuple(line.split()[1:3]) for line in resumed.stdout.splitlines() if line.startswith("DONE")}
    assert not (regraded & finished), "the re-run must not grade again what was finished"
    assert regraded == set(pairs) - finished, (sorted(finished), sorted(regraded), pairs)
    after = {k: v for k, v in _cell_scores(root, db_url).items() if k[1] in REGRADE}
    assert after == first, {k: (first.get(k), after.get(k)) for k in set(first) | set(after)
                            if first.get(k) != after.get(k)}
    held = {a: pipeline.held_feedback(a, root, db_url) for a in REGRADE}
    for student, assignment in pairs:  # every submitted notebook was autograded and got feedback or is held
        submitted = sorted(p.name for p in (root / "submitted" / student / assignment).glob("*.ipynb"))
        graded = sorted(p.name for p in (root / "autograded" / student / assignment).glob("*.ipynb"))
        assert graded == submitted, (student, assignment, submitted, graded)
        html = sorted(p.stem + ".ipynb" for p in (root / "feedback" / student / assignment).glob("*.html"))
        waiting = sorted(nb + ".ipynb" for nb in held[assignment].get(student, []))
        assert not set(html) & set(waiting), (student, assignment, html, waiting)  # held means no page
        assert sorted(html + waiting) == submitted, (student, assignment, html, waiting)
    print(f"[resume] {len(pairs)} student(s) of {', '.join(REGRADE)}: killed after {len(done)}, resumed "
          f"{len(regraded)}, {time.perf_counter() - started:.0f} s")


def test_csv_export_is_one_row_per_student_whatever_the_folder_name(tmp_path):
    """nbgrader_config.py's exporter writes grades.csv with a real CSV writer: commas, quotes and
    newlines in a student id do not add columns or rows."""
    from nbgrader.api import Gradebook

    from rlhf_lab.instructor.operations import csv_export

    cfg = (REPO / "nbgrader_config.py").read_text(encoding="utf-8")
    assert "c.ExportApp.plugin_class" in cfg and "csv_export.py" in cfg
    names = ["doe, jane", "o'neil \"jr\"", "new\nline", "zoë ångström", "plain"]
    url = f"sqlite:///{tmp_path / 'gb.db'}"
    with Gradebook(url) as gb:
        gb.add_assignment("a1")
        gb.add_notebook("nb", "a1")
        gb.add_grade_cell("t1", "nb", "a1", max_score=1, cell_type="code")  # an assignment without points has no rows
        for n in names:
            gb.add_student(n)
        plugin = csv_export.CsvExport(to=str(tmp_path / "grades.csv"))
        plugin.export(gb)
    with open(tmp_path / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["student_id"] for r in rows) == sorted(names)
    assert all(len(r) == len(csv_export.COLUMNS) and None not in r for r in rows)
    assert {r["raw_score"] for r in rows} == {"0.0"}


def test_the_course_export_and_the_backup_export_keep_odd_names_and_only_the_asked_assignments(tmp_path):
    """`nbgrader export` as the pipeline runs it (the course's plugin, restricted to the graded
    assignments) and the backup's grades.csv: a comma in a student id stays one field; an
    assignment not asked for adds no rows, and one without points (an ungraded one in the
    gradebook) adds none even when nothing is asked for."""
    from nbgrader.api import Gradebook

    root = pipeline.copy_course(tmp_path / "course", REPO)
    url = f"sqlite:///{root / 'gradebook.db'}"
    names = ["doe, jane", "plain"]
    with Gradebook(url, pipeline.COURSE_ID) as gb:
        for graded in ("graded_one", "graded_two"):
            gb.add_assignment(graded)
            gb.add_notebook("nb", graded)
            gb.add_grade_cell("t1", "nb", graded, max_score=2, cell_type="code")
        gb.add_assignment("ungraded_one")
        gb.add_notebook("nb", "ungraded_one")
        for n in names:
            gb.add_student(n)
    out = pipeline.export_csv(tmp_path / "grades.csv", root, url, names=["graded_one"])
    backup_csv = backup.export_assignment_csv(url, pipeline.COURSE_ID, tmp_path / "backup_grades.csv")
    for path, assignments in ((out, {"graded_one"}), (backup_csv, {"graded_one", "graded_two"})):
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        assert sorted((r["student_id"], r["assignment"]) for r in rows) == \
            sorted((n, a) for n in names for a in assignments), (path, rows)
        assert all(None not in r and None not in r.values() for r in rows), rows


def test_unaddressable_folder_names_are_rejected_alone_and_the_class_goes_on(tmp_path):
    """A folder name with a newline, or one that is not valid UTF-8, is collected and rejected by the
    pre-flight with a readable name; the other students are checked as usual; the report is written."""
    root = pipeline.copy_course(tmp_path / "course", REPO)
    subs = tmp_path / "subs"
    nb = HOSTILE / "h00_control_correct" / "a1_ppo_objective" / hostile.NB_FILE
    names = ["ok_student", "new\nline", os.fsdecode(b"bad \xff byte"), "doe, jane"]
    for n in names:
        (subs / n / "a1_ppo_objective").mkdir(parents=True)
        shutil.copyfile(nb, subs / n / "a1_ppo_objective" / hostile.NB_FILE)
    os.mkfifo(subs / "ok_student" / "a1_ppo_objective" / "pipe")
    got = pipeline.collect(subs, root, ["a1_ppo_objective"])
    assert sorted(s for s, _ in got.collected) == sorted(names)
    report = integrity.preflight("a1_ppo_objective", root)
    assert sorted(report.ungradable()) == sorted(["new\nline", os.fsdecode(b"bad \xff byte")])
    for f in report.findings:
        if f.code == "student-id-unusable":
            assert "\n" not in f.message and ("\\xff" in f.message or "\\n" in f.message), f.message
    for ok in ("ok_student", "doe, jane"):  # only the notebook they did not submit is blocked
        assert {f.code for f in report.blocking(ok)} == {"missing-notebook"}
    assert "special-file" in {f.code for f in report.for_student("ok_student")}
    saved = json.loads((root / integrity.REPORT_TEMPLATE.format(assignment="a1_ppo_objective")).read_text(
        encoding="utf-8"))
    assert sorted(saved["students"]) == sorted(names)
