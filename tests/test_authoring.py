"""Authoring: the notebooks in ``source/`` are the files instructors edit.

* Every source notebook follows the course's rules (``rlhf_lab.instructor.authoring.lint``), and each
  rule really fires on a notebook that breaks it (a failure names the notebook, the cell id, the rule).
* Each notebook and its jupytext text pair under ``content/`` agree; no pair sits inside ``source/``
  or ``release/`` (nbgrader would copy it, solutions included, to students).
* What Jupyter adds when a notebook is opened, run or saved (kernel ``language_info``, outputs,
  execution counts) is normalised away in one place and does not make ``release/`` stale.
* No script writes ``source/``.
"""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import nbformat
import pytest

from rlhf_lab.instructor import authoring
from rlhf_lab.instructor.operations import release

ROOT = Path(__file__).resolve().parents[1]


def _course_nb(rel: str):
    return nbformat.read(ROOT / rel, as_version=4)


def _rules(found) -> set[str]:
    return {f.rule for f in found}


def _lint_one(nb, graded=True):
    totals = authoring.assignment_totals([nb])
    return authoring.lint_notebook("nb.ipynb", nb, totals, graded=graded)


def _cell(nb, cell_id):
    return next(c for c in nb.cells if c.get("id") == cell_id)


# ------------------------------------------------------------------------------------------------
# the committed course


def test_every_source_notebook_follows_the_rules():
    found = authoring.lint(ROOT)
    assert not found, "\n".join(map(str, found))


def test_every_notebook_and_its_text_pair_agree():
    problems = authoring.pair_diff(ROOT)
    assert not problems, "\n".join(problems) + "\nrun `make pairs`"


def test_text_pairs_live_outside_source_and_release():
    for where in ("source", "release"):
        strays = [p for p in (ROOT / where).rglob("*") if p.is_file() and p.suffix != ".ipynb"
                  and p.name != ".gitkeep" and "__pycache__" not in p.parts]
        assert not strays, f"{where}/ holds files that are not notebooks: {strays}"
    pairs = sorted(p.relative_to(ROOT / "content") for p in (ROOT / "content").rglob("*.py"))
    notebooks = sorted(p.relative_to(ROOT / "source").with_suffix(".py") for p in authoring.course_notebooks(ROOT))
    assert pairs == notebooks


def test_text_pairs_keep_the_nbgrader_metadata_in_cell_headers():
    text = (ROOT / "content" / "a1_ppo_objective" / "01_clipped_objective.py").read_text(encoding="utf-8")
    nb = _course_nb("source/a1_ppo_objective/01_clipped_objective.ipynb")
    test = next(c for c in nb.cells if authoring.is_test_cell(c))
    meta = test.metadata["nbgrader"]
    header = next(line for line in text.splitlines() if f'"grade_id": "{meta["grade_id"]}"' in line)
    assert header.startswith("# %%") and f'"points": {meta["points"]}' in header


def test_no_script_writes_source():
    assert not list((ROOT / "tools").glob("build_source*"))
    for script in (ROOT / "tools").glob("*.py"):
        text = script.read_text(encoding="utf-8")
        assert "ROOT / \"source\"" not in text or "write" not in text.split("ROOT / \"source\"")[1][:200], script


# ------------------------------------------------------------------------------------------------
# normalising what Jupyter adds


def _as_jupyter_saves_it(nb):
    """What JupyterLab writes after opening, running and saving a notebook."""
    nb = copy.deepcopy(nb)
    nb.metadata["language_info"] = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                                    "mimetype": "text/x-python", "name": "python", "version": "3.11.7"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.execution_count = i + 1
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
            cell.metadata["execution"] = {"iopub.status.busy": "2026-12-01T10:00:00Z"}
    return nb


def test_normalise_removes_what_jupyter_adds_and_keeps_the_rest():
    nb = _course_nb("source/a1_ppo_objective/01_clipped_objective.ipynb")
    saved = _as_jupyter_saves_it(nb)
    assert authoring.normalised_text(saved) != nbformat.writes(saved) + "\n"
    assert authoring.normalised_text(saved) == (ROOT / "source/a1_ppo_objective/01_clipped_objective.ipynb").read_text(
        encoding="utf-8")
    assert authoring.normalise(saved).metadata["kernelspec"]["name"] == "python3"


def test_pre_save_hook_normalises_course_notebooks_only():
    nb = _as_jupyter_saves_it(_course_nb("source/a2_ppo_rlhf/01_losses.ipynb"))
    model = {"type": "notebook", "content": copy.deepcopy(nb)}
    authoring.pre_save_hook(model, "source/a2_ppo_rlhf/01_losses.ipynb")
    assert "language_info" not in model["content"].metadata
    assert all(c.get("outputs", []) == [] for c in model["content"].cells)
    scratch = {"type": "notebook", "content": copy.deepcopy(nb)}
    authoring.pre_save_hook(scratch, "my_scratch/work.ipynb")
    assert "language_info" in scratch["content"].metadata


@pytest.mark.slow
def test_release_saved_by_jupyterlab_is_still_in_sync(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    for name in ("nbgrader_config.py", "source", "release"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, course / name)
    nb_path = course / "release" / "a1_ppo_objective" / "01_clipped_objective.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    nb_path.write_text(nbformat.writes(_as_jupyter_saves_it(nb)), encoding="utf-8")
    assert release.release_diff(course) == []
    # a real change still shows
    nb.cells[0].source += "\nA sentence a student should not see here."
    nb_path.write_text(nbformat.writes(nb), encoding="utf-8")
    assert release.release_diff(course) == ["a1_ppo_objective/01_clipped_objective.ipynb"]


def test_jupyter_instructor_config_sets_the_hook():
    text = (ROOT / "jupyter" / "instructor" / "jupyter_server_config.py").read_text(encoding="utf-8")
    assert "rlhf_lab.instructor.authoring.pre_save_hook" in text
    toml = (ROOT / "jupytext.toml").read_text(encoding="utf-8")
    assert 'formats = "source///ipynb,content///py:percent"' in toml


# ------------------------------------------------------------------------------------------------
# each lint rule fires (on a copy of a real notebook with one thing broken)

BASE = "source/a1_ppo_objective/01_clipped_objective.ipynb"


@pytest.fixture()
def nb():
    return _course_nb(BASE)


def test_lint_is_quiet_on_the_course_notebook(nb):
    found = [f for f in _lint_one(nb) if f.rule != "points-table"]  # one notebook alone has other totals
    assert found == []


def test_lint_names_outputs_and_execution_counts(nb):
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.execution_count = 3
    found = _lint_one(nb)
    assert any(f.rule == "clean" and f.cell_id == code.id for f in found)


def test_lint_names_jupyter_metadata(nb):
    nb.metadata["language_info"] = {"name": "python", "version": "3.11.7"}
    assert "clean" in _rules(_lint_one(nb))


def test_lint_names_duplicate_cell_ids(nb):
    nb.cells[3].id = nb.cells[2].id
    found = [f for f in _lint_one(nb) if f.rule == "cell-id"]
    assert found and found[0].cell_id == nb.cells[2].id


def test_lint_names_a_changed_start_cell(nb):
    start = next(c for c in nb.cells if c.cell_type == "code")
    start.source = "%matplotlib widget\n" + start.source
    assert "start-cell" in _rules(_lint_one(nb))


def test_lint_names_a_graded_cell_without_points(nb):
    test = next(c for c in nb.cells if authoring.is_test_cell(c))
    test.metadata["nbgrader"]["points"] = 0
    found = _lint_one(nb)
    assert any(f.rule == "points" and f.cell_id == test.id for f in found)


def test_lint_names_points_that_disagree_with_the_table(nb):
    test = next(c for c in nb.cells if authoring.is_test_cell(c))
    test.metadata["nbgrader"]["points"] += 1
    found = [f for f in _lint_one(nb) if f.rule == "points-table"]
    assert any(test.metadata["nbgrader"]["grade_id"] in f.message for f in found), found


def test_lint_names_a_test_cell_without_a_hidden_region(nb):
    test = next(c for c in nb.cells if authoring.is_test_cell(c))
    test.source = test.source.split("### BEGIN HIDDEN TESTS")[0] + "assert True\n"
    found = _lint_one(nb)
    assert any(f.rule == "test-cell" and f.cell_id == test.id for f in found)


def test_lint_names_hidden_code_that_is_not_a_judged_check(nb):
    test = next(c for c in nb.cells if authoring.is_test_cell(c))
    test.source = test.source.replace("### END HIDDEN TESTS", "assert ppo_surrogate(1.0, 1.0) == 1.0\n### END HIDDEN TESTS")
    found = [f for f in _lint_one(nb) if f.rule == "test-cell"]
    assert found and "grading.judge" in found[0].message and found[0].cell_id == test.id


def test_lint_names_a_test_cell_without_its_comment(nb):
    test = next(c for c in nb.cells if authoring.is_test_cell(c))
    test.source = "\n".join(test.source.splitlines()[1:])
    found = _lint_one(nb)
    assert any(f.rule == "test-cell" and f.cell_id == test.id for f in found)


def test_lint_names_a_duplicate_grade_id(nb):
    tests = [c for c in nb.cells if authoring.is_test_cell(c)]
    tests[1].metadata["nbgrader"]["grade_id"] = tests[0].metadata["nbgrader"]["grade_id"]
    assert "grade-id" in _rules(_lint_one(nb))


def test_lint_names_an_unlocked_text_cell_and_a_stray_cell(nb):
    text = next(c for c in nb.cells if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("locked"))
    text.metadata["nbgrader"]["locked"] = False
    nb.cells.append(nbformat.v4.new_code_cell("x = 1"))
    found = [f for f in _lint_one(nb) if f.rule == "cell-kind"]
    assert {f.cell_id for f in found} >= {text.id, nb.cells[-1].id}


def test_lint_finding_names_notebook_cell_and_rule():
    f = authoring.Finding("source/a/01.ipynb", "test_x", "points", "graded cell has points 0")
    assert str(f) == "source/a/01.ipynb [test_x] points: graded cell has points 0"
    assert set(authoring.RULES) >= {"clean", "cell-id", "start-cell", "grade-id", "points", "points-table",
                                     "test-cell", "cell-kind", "answer-read", "task-points"}


def test_pairs_detect_an_edit_on_either_side(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    for name in ("jupytext.toml", "source", "content"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, course / name)
    assert authoring.pair_diff(course) == []
    py = course / "content" / "a2_ppo_rlhf" / "01_losses.py"
    py.write_text(py.read_text(encoding="utf-8").replace("# %%", "# %%\nx = 1\n\n# %%", 1), encoding="utf-8")
    assert authoring.pair_diff(course) == ["source/a2_ppo_rlhf/01_losses.ipynb: its text pair "
                                           "content/a2_ppo_rlhf/01_losses.py is out of sync"]
    authoring.write_pairs(course)
    assert authoring.pair_diff(course) == []
    (course / "content" / "a2_ppo_rlhf" / "99_gone.py").write_text("# %%\n", encoding="utf-8")
    assert any("no notebook" in p for p in authoring.pair_diff(course))
    assert json.loads((course / "source/a2_ppo_rlhf/01_losses.ipynb").read_text())["nbformat"] == 4


def test_lint_names_an_answer_cell_no_check_reads(nb):
    """An answer cell whose names no hidden check needs cannot be graded (a2 had one: the behaviour-policy
    gradients cell); the rule names it, and an answer read through another answer still counts."""
    answer = next(c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution"))
    stray = nbformat.v4.new_code_cell("### BEGIN SOLUTION\nunread_value = 3\n### END SOLUTION")
    stray.metadata["nbgrader"] = {"grade": False, "grade_id": "unread_answer", "locked": False,
                                  "schema_version": 3, "solution": True, "task": False}
    nb.cells.insert(nb.cells.index(answer) + 1, stray)
    found = [f for f in _lint_one(nb) if f.rule == "answer-read"]
    assert [f.cell_id for f in found] == [stray.id] and "unread_answer" in found[0].message
    # once a checked answer uses it, a check reads it too
    answer.source = answer.source.replace("### END SOLUTION", "unread_value\n### END SOLUTION")
    nb.cells.remove(stray)
    nb.cells.insert(nb.cells.index(answer), stray)
    assert [f for f in _lint_one(nb) if f.rule == "answer-read"] == []


def test_every_answer_cell_of_the_course_is_read_by_a_check():
    for path in sorted((ROOT / "source").glob("*/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if not authoring.assignment_totals([nb])[0]:
            continue
        read = authoring.read_answer_cells(nb)
        for index, cell in enumerate(nb.cells):
            m = cell.metadata.get("nbgrader", {})
            if cell.cell_type == "code" and m.get("solution") and not m.get("grade"):
                assert index in read, f"{path.name}: {m['grade_id']}"


def test_lint_names_a_task_heading_whose_points_disagree_with_the_metadata():
    """The text said 3 points, the metadata 4: the heading's cell is named with both numbers."""
    nb = _course_nb("source/a1_ppo_objective/01_clipped_objective.ipynb")
    assert [f for f in _lint_one(nb) if f.rule == "task-points"] == []
    heading = next(c for c in nb.cells if c.cell_type == "markdown" and "### Task 1.2:" in c.source)
    heading.source = heading.source.replace("(3 points)", "(4 points)")
    found = [f for f in _lint_one(nb) if f.rule == "task-points"]
    assert [f.cell_id for f in found] == [heading.id] and "Task 1.2" in found[0].message, found
    assert "4 points" in found[0].message and "add up to 3" in found[0].message


def test_make_release_stops_on_a_lint_error_and_releases_nothing(tmp_path):
    import shutil
    import subprocess
    import sys

    course = tmp_path / "course"
    for part in ("source", "release", "nbgrader_config.py"):
        src = ROOT / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, course / part)
    path = course / "source" / "a1_ppo_objective" / "01_clipped_objective.ipynb"
    nb = nbformat.read(path, as_version=4)
    heading = next(c for c in nb.cells if c.cell_type == "markdown" and "### Task 1.2:" in c.source)
    heading.source = heading.source.replace("(3 points)", "(4 points)")
    nbformat.write(nb, path)
    before = {p: p.read_bytes() for p in (course / "release").rglob("*") if p.is_file()}
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "make_release.py"), "--root", str(course)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "task-points" in out.stdout and "nothing released" in out.stdout, out.stdout
    assert {p: p.read_bytes() for p in (course / "release").rglob("*") if p.is_file()} == before
