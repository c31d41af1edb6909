"""The source notebooks of ``a3_ppo_sequences``: structure, solutions pass, classic mistakes fail.

* Structure (no kernel): every notebook starts with the locked ``grading.start()`` cell, graded
  cells are well formed, every experiment follows a prediction, plots label their axes with units,
  the recipes target real cells and cover every classic mistake of the assignment.
* Execution (one Jupyter kernel per notebook, shared by its runs; marked slow): the source
  notebook passes every test cell; nbgrader's release stubs fail every test cell; each mistake
  recipe of ``examples/mistakes/a3_ppo_sequences.py`` fails exactly its target test cells with its
  message and passes the rest (classic recipes as nbgrader runs them, every recipe hidden-only).
"""
from __future__ import annotations

import os
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


recipes = load_module(REPO / "examples" / "mistakes" / "a3_ppo_sequences.py", "ppo_sequences_mistakes")

NOTEBOOKS = {p.name: nbformat.read(p, as_version=4)
             for p in sorted((REPO / "source" / "a3_ppo_sequences").glob("*.ipynb"))}
NAMES = list(NOTEBOOKS)


# ------------------------------------------------------------------------------------------------
# Structure (cheap, no kernel)


# The start cell, the layout of test cells, written answers and points: the course lint
# (tests/test_authoring.py) checks them for every notebook of every assignment.

EXPERIMENTS = {
    "experiment_mask", "experiment_nll", "experiment_pref", "experiment_rewards", "experiment_gae",
    "experiment_losses", "experiment_batch", "experiment_epochs", "experiment_loop", "experiment_kl",
    "experiment_overopt", "experiment_contrasts",
}


def test_every_experiment_is_preceded_by_a_prediction():
    seen = set()
    for nb in NOTEBOOKS.values():
        pending = False
        for cell in nb.cells:
            if cell.cell_type == "markdown" and not _nbgrader(cell) and cell.source.startswith("**Predict**"):
                pending = True
            elif _grade_id(cell) in EXPERIMENTS:
                assert pending, f"no prediction before {_grade_id(cell)}"
                pending = False
                seen.add(_grade_id(cell))
    assert seen == EXPERIMENTS


def test_plots_label_their_axes():
    for nb in NOTEBOOKS.values():
        for cell in nb.cells:
            if cell.cell_type == "code" and "plt.show()" in cell.source:
                assert cell.source.count("set_xlabel") >= 1 and cell.source.count("set_ylabel") >= 1, cell.id
                assert "(" in cell.source.split("set_xlabel", 1)[1].split("\n", 1)[0], cell.id  # units in brackets


def test_recipes_target_existing_cells():
    for key, recipe in recipes.MISTAKES.items():
        nb = NOTEBOOKS[recipe["notebook"]]
        answer_ids = {_grade_id(c) for c in nb.cells if _nbgrader(c).get("solution")}
        assert recipe["cell"] in answer_ids, key
        assert set(recipe["fails"]) <= set(_test_ids(nb)), key
        assert "### BEGIN SOLUTION" not in recipe["source"]
    classic = {k for k, r in recipes.MISTAKES.items() if r["classic"]}
    assert {"eos_masked_as_padding", "score_on_padding", "kl_against_old_policy_seq",
            "recompute_old_logp_epochs"} == classic
    assert {"kl_penalty_wrong_sign", "whiten_over_padding", "value_loss_on_padding"} <= set(recipes.MISTAKES)


def test_points_add_up():
    total = sum(_nbgrader(c).get("points", 0) for nb in NOTEBOOKS.values() for c in nb.cells
                if _nbgrader(c).get("grade"))
    by_hand = sum(_nbgrader(c).get("points", 0) for nb in NOTEBOOKS.values() for c in nb.cells
                  if _nbgrader(c).get("grade") and c.cell_type == "markdown")
    assert (total, by_hand) == (45, 6)


def test_explorer_and_contrast_runs_are_skipped_under_autograding():
    nb = NOTEBOOKS["03_loop_and_analysis.ipynb"]
    for gid in ("explorer_seq", "contrast_runs"):
        cell = next(c for c in nb.cells if _grade_id(c) == gid)
        assert 'os.environ.get("NBGRADER_EXECUTION")' in cell.source.splitlines()[2], gid


def test_sequence_explorer_exists():
    from rlhf_lab.sequences.explorer import SequenceExplorer

    assert callable(SequenceExplorer)


# ------------------------------------------------------------------------------------------------
# Execution


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_solutions_pass_every_test_cell(name, run_variant):
    executed = run_variant(name, "solution", lambda: NOTEBOOKS[name])
    problems = solution_problems(executed)
    assert not problems, problems


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_release_stubs_fail_every_test_cell(name, run_variant):
    executed = run_variant(name, "release-stubs", lambda: release_stubs(NOTEBOOKS[name]))
    passing = [grade_id(c) for c in executed.cells if is_test(c) and not errors(c)]
    assert not passing, f"test cells that pass without any answer: {passing}"


# Classic recipes run hidden-only: what decides the grade (during autograding the judge decides each
# test cell from its hidden region; the visible checks are for the student's own runs). Every recipe
# also runs in full, as a student would: its target tests must fail with the diagnosis. Those are slow.
RECIPE_RUNS = [(k, "hidden-only") for k, r in recipes.MISTAKES.items() if r["classic"]] + [
    pytest.param(k, "full", marks=pytest.mark.slow) for k in recipes.MISTAKES
]


@pytest.mark.slow
@pytest.mark.parametrize("key,part", RECIPE_RUNS)
def test_mistake_fails_its_tests_and_keeps_the_rest(key, part, run_variant):
    recipe = recipes.MISTAKES[key]
    name = recipe["notebook"]

    def make():
        nb = recipes.apply_mistake(NOTEBOOKS[name], recipe)
        return hidden_only(nb) if part == "hidden-only" else nb

    check_recipe_run(key, recipe, part, run_variant(name, f"{key}/{part}", make))
