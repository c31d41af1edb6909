"""The source notebooks of ``ppo_rlhf``: structure, solutions pass, classic mistakes fail.

* Structure (no kernel): generation is deterministic, every notebook starts with the locked
  ``grading.start()`` cell, graded cells carry points that add up to the stated total, every test
  cell says what it checks and has a hidden block, each experiment is preceded by a prediction.
* Execution (one Jupyter kernel per notebook, shared by every run of that notebook): the source
  notebook with its solutions passes every test cell; with nbgrader's release stubs in place of
  the solutions every test cell fails; and each mistake recipe of ``examples/mistakes/ppo_rlhf.py``
  (clip without the signed min, recomputed old log probs, KL against the old policy, missing
  stop_gradient, hard-coded numbers, delegation to ``rlhf_lab``, ...) fails exactly the test cells
  it targets, with the intended message, and passes the rest.

Runs of one notebook reuse a kernel (``%reset -f`` before each run) so JAX's compile caches stay
warm; a fresh-kernel, real-``nbgrader autograde`` run of the same recipes belongs to the pipeline
tests.
"""
from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import nbformat
import pytest

from course_support import load_module

REPO = Path(__file__).resolve().parents[1]


recipes = load_module(REPO / "examples" / "mistakes" / "ppo_rlhf.py", "ppo_rlhf_mistakes")

NOTEBOOKS = {p.name: nbformat.read(p, as_version=4) for p in sorted((REPO / "source" / "ppo_rlhf").glob("*.ipynb"))}
NAMES = list(NOTEBOOKS)


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _grade_id(cell) -> str | None:
    return _nbgrader(cell).get("grade_id")


def _is_test(cell) -> bool:
    meta = _nbgrader(cell)
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def _test_ids(nb) -> list[str]:
    return [_grade_id(c) for c in nb.cells if _is_test(c)]


# ------------------------------------------------------------------------------------------------
# Structure (cheap, no kernel)


@pytest.mark.parametrize("name", NAMES)
def test_first_code_cell_is_the_locked_grading_start(name):
    first = next(c for c in NOTEBOOKS[name].cells if c.cell_type == "code")
    assert first.source == "from rlhf_lab import grading\ngrading.start()"
    meta = _nbgrader(first)
    assert meta["locked"] and not meta["solution"] and not meta["grade"]


@pytest.mark.parametrize("name", NAMES)
def test_graded_cells_are_well_formed(name):
    nb = NOTEBOOKS[name]
    for cell in nb.cells:
        meta = _nbgrader(cell)
        if _is_test(cell):
            assert meta["locked"] and meta["points"] > 0
            first_line = cell.source.splitlines()[0]
            assert re.match(rf"# {meta['grade_id']}: \S", first_line), first_line
            assert cell.source.count("### BEGIN HIDDEN TESTS") == 1 == cell.source.count("### END HIDDEN TESTS")
            hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1]
            assert "grading." in hidden, f"{meta['grade_id']}: hidden tests must decide with rlhf_lab.grading"
        elif meta.get("solution"):
            assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source
            assert not meta["locked"]
            if meta.get("grade"):  # written answer, graded by hand
                assert cell.cell_type == "markdown" and meta["points"] > 0 and "Rubric" in cell.source


EXPERIMENTS = {
    "experiment_clip_terms", "fit_lesson_rewards", "reference_experiment", "run_lesson_03",
    "experiment_clip_04", "experiment_baseline", "kl_values_answer", "objective_values_answer", "explorer_cell",
}


def test_every_experiment_is_preceded_by_a_prediction():
    seen = set()
    for nb in NOTEBOOKS.values():
        pending = False
        for cell in nb.cells:
            if cell.id.startswith("predict"):
                assert cell.cell_type == "markdown" and "**Predict**" in cell.source
                pending = True
            elif cell.id in EXPERIMENTS:
                assert pending, f"no prediction before {cell.id}"
                pending = False
                seen.add(cell.id)
    assert seen == EXPERIMENTS


def test_plots_label_their_axes():
    for nb in NOTEBOOKS.values():
        for cell in nb.cells:
            if cell.cell_type == "code" and "plt.show()" in cell.source and "three_panel_figure" not in cell.source:
                assert cell.source.count("set_xlabel") >= 1 and cell.source.count("set_ylabel") >= 1, cell.id
                assert "units" in cell.source, cell.id


def test_recipes_target_existing_cells():
    for key, recipe in recipes.MISTAKES.items():
        nb = NOTEBOOKS[recipe["notebook"]]
        answer_ids = {_grade_id(c) for c in nb.cells if _nbgrader(c).get("solution")}
        assert recipe["cell"] in answer_ids, key
        assert set(recipe["fails"]) <= set(_test_ids(nb)), key
        assert "### BEGIN SOLUTION" not in recipe["source"]
    classic = {k for k, r in recipes.MISTAKES.items() if r["classic"]}
    assert {"clip_without_signed_min", "recompute_old_logp", "kl_against_old_policy", "no_stop_gradient_advantages",
            "hard_coded_run", "delegation_import"} <= classic


def test_explorer_entry_point_exists():
    from rlhf_lab.explorer import explore

    assert callable(explore)


# ------------------------------------------------------------------------------------------------
# Execution


class NotebookKernel:
    """One kernel for all runs of one notebook: each run resets the namespace, then runs every cell."""

    def __init__(self):
        from jupyter_client import KernelManager

        self.km = KernelManager(kernel_name="python3")
        # NBGRADER_EXECUTION makes the notebooks behave as under autograding (the explorer is skipped).
        self.km.start_kernel(env={**os.environ, "NBGRADER_EXECUTION": "autograde", "JAX_PLATFORMS": "cpu"})

    def run(self, nb):
        from nbclient import NotebookClient

        nb = copy.deepcopy(nb)
        nb.cells.insert(0, nbformat.v4.new_code_cell("%reset -f", id="reset-namespace"))
        client = NotebookClient(nb, km=self.km, timeout=600, allow_errors=True, kernel_name="python3")
        try:
            client.execute()
        finally:
            if client.kc is not None:
                client.kc.stop_channels()
        nb.cells.pop(0)
        return nb

    def close(self):
        self.km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def run_variant():
    """``run_variant(name, key, make)`` executes ``make()`` once per key, in the kernel of ``name``."""
    kernels: dict[str, NotebookKernel] = {}
    results: dict[tuple[str, str], nbformat.NotebookNode] = {}

    def run(name, key, make):
        if (name, key) not in results:
            if name not in kernels:
                kernels[name] = NotebookKernel()
            results[(name, key)] = kernels[name].run(make())
        return results[(name, key)]

    try:
        yield run
    finally:
        for kernel in kernels.values():
            kernel.close()


def _errors(cell) -> list[str]:
    return [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]


def _stderr(cell) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr")


def _by_id(nb) -> dict:
    return {_grade_id(c) or c.id: c for c in nb.cells}


@pytest.mark.parametrize("name", NAMES)
def test_solutions_pass_every_test_cell(name, run_variant):
    executed = run_variant(name, "solution", lambda: NOTEBOOKS[name])
    problems = {}
    for cell in executed.cells:
        if cell.cell_type != "code":
            continue
        if _errors(cell):
            problems[_grade_id(cell) or cell.id] = _errors(cell)
        elif _is_test(cell) and _stderr(cell):
            problems[_grade_id(cell)] = ["wrote to stderr: " + _stderr(cell)[:300]]
    assert not problems, problems


def _release_stubs(nb):
    """The notebook as a student receives it (nbgrader's ClearSolutions), hidden tests kept in place."""
    from nbgrader.preprocessors import ClearSolutions

    stubbed, _ = ClearSolutions().preprocess(copy.deepcopy(nb), {})
    return stubbed


@pytest.mark.parametrize("name", NAMES)
def test_release_stubs_fail_every_test_cell(name, run_variant):
    executed = run_variant(name, "release-stubs", lambda: _release_stubs(NOTEBOOKS[name]))
    passing = [_grade_id(c) for c in executed.cells if _is_test(c) and not _errors(c)]
    assert not passing, f"test cells that pass without any answer: {passing}"


def _hidden_only(nb):
    """Test cells reduced to their hidden block: what decides the grade if visible asserts are neutralised."""
    out = copy.deepcopy(nb)
    for cell in out.cells:
        if _is_test(cell):
            hidden = cell.source.split("### END HIDDEN TESTS")[0]
            cell.source = hidden + "### END HIDDEN TESTS\n"
    return out


# Classic recipes run hidden-only: what decides the grade (during autograding the judge decides each
# test cell from its hidden region; the visible checks are for the student's own runs). Every recipe
# also runs in full, as a student would (visible checks included): the tests it targets must fail
# with the diagnosis; other visible checks may fail too when they use the student's own broken work
# (the recorded run uses the student's rollout_update). Those runs are marked slow.
RECIPE_RUNS = [(k, "hidden-only") for k, r in recipes.MISTAKES.items() if r["classic"]] + [
    pytest.param(k, "full", marks=pytest.mark.slow) for k in recipes.MISTAKES
]


@pytest.mark.parametrize("key,part", RECIPE_RUNS)
def test_mistake_fails_its_tests_and_keeps_the_rest(key, part, run_variant):
    recipe = recipes.MISTAKES[key]
    name = recipe["notebook"]

    def make():
        nb = recipes.apply_mistake(NOTEBOOKS[name], recipe)
        return _hidden_only(nb) if part == "hidden-only" else nb

    executed = run_variant(name, f"{key}/{part}", make)
    cells = _by_id(executed)
    for test_id in _test_ids(executed):
        errors = _errors(cells[test_id])
        if test_id in recipe["fails"]:
            assert errors, f"{key}: {test_id} should fail but passed"
            expected = recipe["fails"][test_id]
            if expected is not None:
                assert any(expected in e for e in errors), f"{key}: {test_id} failed with {errors}, expected {expected!r}"
        elif part == "hidden-only":
            assert not errors, f"{key}: {test_id} should still pass but failed with {errors}"
