"""The hidden tests of ``a3_ppo_sequences`` (``rlhf_lab.judging.sequences_checks``), outside any notebook.

* Every check passes the source notebooks' solutions on several fresh draws.
* Every mistake recipe of ``examples/mistakes/a3_ppo_sequences.py`` fails the checks it targets with
  the message that names the mistake, and passes the other checks of its notebook.
* The fresh inputs cover the edge cases: a response of length 1, a truncated response, EOS and PAD
  apart; junk on padding positions never changes a correct answer.
"""
from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import nbformat
import numpy as np
import pytest

from course_support import load_module
from rlhf_lab import sequences as sq
from rlhf_lab.judging import CHECKS, core, sequences_checks
from rlhf_lab.judging.core import GradingError, LocalStudent

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "source" / "a3_ppo_sequences"
REF = core.library_reference()
recipes = load_module(REPO / "examples" / "mistakes" / "a3_ppo_sequences.py", "ppo_sequences_mistakes_j")

CHECKS_BY_NOTEBOOK: dict[str, list[str]] = {}
for _name, _check in CHECKS.items():
    if _check.assignment == "a3_ppo_sequences":
        CHECKS_BY_NOTEBOOK.setdefault(_check.notebook, []).append(_name)


def namespace(notebook: str, replace: dict | None = None) -> dict:
    """The answer cells of a source notebook run in a namespace with the names its given cells provide."""
    ns = {"jax": jax, "jnp": jnp, "np": np, "LANG": sq.DEFAULT_LANGUAGE, "EOS": sq.DEFAULT_LANGUAGE.eos,
          "PAD": sq.DEFAULT_LANGUAGE.pad}
    for name in ("context_features", "token_logp", "response_mask", "per_token_rewards", "policy_loss"):
        ns[name] = getattr(sq, name)
    nb = nbformat.read(SOURCE / notebook, as_version=4)
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("solution"):
            exec((replace or {}).get(meta.get("grade_id"), cell.source), ns)  # noqa: S102 - course code
    return ns


def _run(name, ns, seed=0):
    CHECKS[name].run(LocalStudent(ns), np.random.default_rng(seed), REF)


def test_every_test_cell_has_a_check():
    for path in sorted(SOURCE.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        ids = {c.metadata["nbgrader"]["grade_id"] for c in nb.cells
               if c.cell_type == "code" and c.get("metadata", {}).get("nbgrader", {}).get("grade")}
        assert ids == set(CHECKS_BY_NOTEBOOK[path.name]), path.name


@pytest.mark.parametrize("notebook", sorted(CHECKS_BY_NOTEBOOK))
def test_solutions_pass_every_check(notebook):
    ns = namespace(notebook)
    for name in CHECKS_BY_NOTEBOOK[notebook]:
        for seed in (0, 1):
            _run(name, ns, seed)


@pytest.mark.parametrize("key", sorted(recipes.MISTAKES))
def test_each_mistake_is_named(key):
    recipe = recipes.MISTAKES[key]
    ns = namespace(recipe["notebook"], {recipe["cell"]: recipe["source"]})
    for name in CHECKS_BY_NOTEBOOK[recipe["notebook"]]:
        if name in recipe["fails"]:
            with pytest.raises(GradingError) as err:
                _run(name, ns, seed=2)
            message = recipe["fails"][name]
            assert message is None or message in str(err.value), str(err.value)
        else:
            _run(name, ns, seed=2)


def test_fresh_responses_cover_the_edge_cases():
    tokens, mask, lengths = sequences_checks.fresh_responses(np.random.default_rng(5), 8)
    assert lengths[0] == 1 and tokens[0, 0] == sq.DEFAULT_LANGUAGE.eos          # EOS alone
    assert lengths[1] == 6 and not np.any(tokens[1] == sq.DEFAULT_LANGUAGE.eos)  # truncated
    np.testing.assert_array_equal(mask, np.asarray(sq.response_mask(tokens, 5, 6)))
    assert np.all(tokens[mask == 0] == sq.DEFAULT_LANGUAGE.pad)


def test_answers_that_are_not_plain_data_are_refused():
    class Sneaky:
        def __eq__(self, other):
            return True

    with pytest.raises(GradingError):
        _run("test_seq_response_mask", {"response_mask": lambda tokens, eos, pad: Sneaky()})



def _formula_np(dtype):
    """GRPO advantages exactly as the task statement writes them, in NumPy of ``dtype`` (no constant-group rule)."""
    def group_advantages(scores):
        s = np.asarray(scores, dtype)
        return (s - s.mean(axis=1, keepdims=True)) / (s.std(axis=1, keepdims=True) + dtype(1e-6))
    return group_advantages


def _formula_jnp_sum(scores):
    """The statement's formula in JAX float32 with jnp.sum(...) / K for the mean and the variance."""
    k = scores.shape[1]
    mu = jnp.sum(scores, axis=1, keepdims=True) / k
    return (scores - mu) / (jnp.sqrt(jnp.sum((scores - mu) ** 2, axis=1, keepdims=True) / k) + 1e-6)


def _formula_jnp_mean(scores):
    """The statement's formula with jnp.mean and jnp.std."""
    return (scores - jnp.mean(scores, axis=1, keepdims=True)) / (jnp.std(scores, axis=1, keepdims=True) + 1e-6)


@pytest.mark.parametrize("answer", [_formula_np(np.float32), _formula_np(np.float64), _formula_jnp_sum,
                                    _formula_jnp_mean], ids=["np32", "np64", "jnp_sum_over_k", "jnp_mean"])
def test_group_advantages_check_passes_the_plain_formula(answer):
    """The statement's formula gets full marks on every seed, in any precision: the constant row is
    compared with 0 and the grader's equal scores have an exact mean (it used to fail on about 40% of
    the seeds with "row 0: all scores equal, so 0: expected [[-0.32...")."""
    for seed in range(40):
        _run("test_seq_group_advantages", {"group_advantages": answer}, seed)


def test_group_advantages_check_wants_zeros_on_the_constant_row():
    """A constant row that is not 0 fails with a message asking for 0 (here: 0 / 0 without the + 1e-6)."""
    def no_epsilon(scores):
        mu = jnp.mean(scores, axis=1, keepdims=True)
        return (scores - mu) / jnp.std(scores, axis=1, keepdims=True)

    with pytest.raises(GradingError) as err:
        _run("test_seq_group_advantages", {"group_advantages": no_epsilon}, 3)
    assert "row 0 (all" in str(err.value) and "must be 0" in str(err.value) and "NaN" in str(err.value), str(err.value)


def test_natural_jax_answers_get_their_inputs_as_jax_arrays():
    """A check sends NumPy only where the statement says so: ``r.at[rows, last].add(score)`` works."""
    def per_token_rewards(logp, ref_logp, score, mask, beta):
        r = -beta * (logp - ref_logp) * mask
        last = jnp.sum(mask, axis=-1).astype(jnp.int32) - 1
        return r.at[jnp.arange(r.shape[0]), last].add(score)

    for seed in range(5):
        _run("test_seq_rewards_kl", {"per_token_rewards": per_token_rewards}, seed)
        _run("test_seq_rewards_score_position", {"per_token_rewards": per_token_rewards}, seed)


def test_an_integer_mask_fails_where_a_float_mask_is_asked():
    def int_mask(tokens, eos, pad):
        return np.asarray(sq.response_mask(tokens, eos, pad)).astype(np.int32)

    with pytest.raises(GradingError) as err:
        _run("test_seq_response_mask", {"response_mask": int_mask}, 0)
    assert "must return a float mask" in str(err.value) and "int32" in str(err.value), str(err.value)
