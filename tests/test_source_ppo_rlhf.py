"""The source notebooks of ``a2_ppo_rlhf``: structure, solutions pass, classic mistakes fail.

* Structure (no kernel): generation is deterministic, every notebook starts with the locked
  ``grading.start()`` cell, graded cells carry points that add up to the stated total, every test
  cell says what it checks and has a hidden block, each experiment is preceded by a prediction.
* Execution (one Jupyter kernel per notebook, shared by every run of that notebook): the source
  notebook with its solutions passes every test cell; with nbgrader's release stubs in place of
  the solutions every test cell fails; and each mistake recipe of ``examples/mistakes/a2_ppo_rlhf.py``
  (clip without the signed min, recomputed old log probs, KL against the old policy, missing
  stop_gradient, hard-coded numbers, delegation to ``rlhf_lab``, ...) fails exactly the test cells
  it targets, with the intended message, and passes the rest.

Runs of one notebook reuse a kernel (``%reset -f`` before each run) so JAX's compile caches stay
warm; a fresh-kernel, real-``nbgrader autograde`` run of the same recipes belongs to the pipeline
tests.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course_support import load_module
from notebook_support import (  # noqa: F401  (run_variant is a fixture)
    check_recipe_run, errors, grade_id, hidden_only, is_test, nbgrader_meta, release_stubs, run_variant,
    solution_problems, graded_test_ids,
)

_nbgrader, _grade_id, _is_test, _test_ids = nbgrader_meta, grade_id, is_test, graded_test_ids

REPO = Path(__file__).resolve().parents[1]


recipes = load_module(REPO / "examples" / "mistakes" / "a2_ppo_rlhf.py", "ppo_rlhf_mistakes")

NOTEBOOKS = {p.name: nbformat.read(p, as_version=4) for p in sorted((REPO / "source" / "a2_ppo_rlhf").glob("*.ipynb"))}
NAMES = list(NOTEBOOKS)


# ------------------------------------------------------------------------------------------------
# Structure (cheap, no kernel)


# The start cell, the layout of test cells, written answers and points: the course lint
# (tests/test_authoring.py) checks them for every notebook of every assignment.

EXPERIMENTS = {
    "experiment_clip_terms", "fit_lesson_rewards", "reference_experiment", "run_lesson_03", "diagnostics_experiment",
    "experiment_clip_04", "experiment_baseline", "kl_values_04", "objective_values_answer", "explorer_cell",
    "seed_sweep_04", "frontier_sweep_04",
}


def test_every_experiment_is_preceded_by_a_prediction():
    seen = set()
    for nb in NOTEBOOKS.values():
        pending = False
        for cell in nb.cells:
            if cell.id.startswith("predict"):
                assert cell.cell_type == "markdown" and cell.source.startswith("**Prediction** (not graded")
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


@pytest.mark.parametrize("name", NAMES)
def test_solutions_pass_every_test_cell(name, run_variant):
    executed = run_variant(name, "solution", lambda: NOTEBOOKS[name])
    problems = solution_problems(executed)
    assert not problems, problems


@pytest.mark.parametrize("name", NAMES)
def test_release_stubs_fail_every_test_cell(name, run_variant):
    executed = run_variant(name, "release-stubs", lambda: release_stubs(NOTEBOOKS[name]))
    passing = [grade_id(c) for c in executed.cells if is_test(c) and not errors(c)]
    assert not passing, f"test cells that pass without any answer: {passing}"


# Classic recipes run hidden-only: what decides the grade (during autograding the judge decides each
# test cell from its hidden region; the visible checks are for the student's own runs). Every recipe
# also runs in full, as a student would: its target tests must fail with the diagnosis. Those are slow.
# Delegation recipes are left out: these runs use the full library in the kernel, where delegating works;
# in grading the kernel's build lacks the function (tests/test_library_build.py, tests/test_trust.py).
RECIPE_RUNS = [(k, "hidden-only") for k, r in recipes.MISTAKES.items() if r["classic"] and not r.get("delegation")] + [
    pytest.param(k, "full", marks=pytest.mark.slow) for k, r in recipes.MISTAKES.items() if not r.get("delegation")
]


@pytest.mark.parametrize("key,part", RECIPE_RUNS)
def test_mistake_fails_its_tests_and_keeps_the_rest(key, part, run_variant):
    recipe = recipes.MISTAKES[key]
    name = recipe["notebook"]

    def make():
        nb = recipes.apply_mistake(NOTEBOOKS[name], recipe)
        return hidden_only(nb) if part == "hidden-only" else nb

    check_recipe_run(key, recipe, part, run_variant(name, f"{key}/{part}", make))
