"""Every bad input fails early with a ValueError that names the argument (and its allowed range),
never a bare assert or a silent NaN."""
import math

import numpy as np
import pytest

from rlhf_lab import plots, reward, sweep, trainer
from rlhf_lab.trainer import PPOConfig

NAN, INF = float("nan"), float("inf")


def _raises(fn, *words):
    with pytest.raises(ValueError) as info:
        fn()
    message = str(info.value)
    for word in words:
        assert word in message, f"message {message!r} should mention {word!r}"
    return message


@pytest.mark.parametrize("value", [0.0, -0.1, -5, NAN, INF, -INF, "abc", [0.1, 0.2]])
def test_bad_beta(value):
    _raises(lambda: PPOConfig(beta=value), "beta")


def test_beta_message_states_the_range():
    _raises(lambda: PPOConfig(beta=0.0), "beta", "> 0")


@pytest.mark.parametrize("value", [0.0, 1.0, 1.5, -0.2, NAN, INF])
def test_bad_epsilon(value):
    _raises(lambda: PPOConfig(epsilon=value), "epsilon")


def test_epsilon_message_states_the_range():
    _raises(lambda: PPOConfig(epsilon=1.0), "epsilon", "(0, 1)")


@pytest.mark.parametrize("value", [0.0, -0.01, NAN, INF])
def test_bad_learning_rate(value):
    _raises(lambda: PPOConfig(learning_rate=value), "learning_rate")


@pytest.mark.parametrize("value", [0, -3, 2.5, NAN, "8", True])
def test_bad_batch_size(value):
    _raises(lambda: PPOConfig(batch_size=value), "batch_size")


def test_batch_size_message_states_the_range():
    _raises(lambda: PPOConfig(batch_size=0), "batch_size", ">= 1")


@pytest.mark.parametrize("field", ["iterations", "epochs"])
@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_bad_loop_sizes(field, value):
    _raises(lambda: PPOConfig(**{field: value}), field)


@pytest.mark.parametrize("value", [-1, 1.5, NAN])
def test_bad_seed(value):
    _raises(lambda: PPOConfig(seed=value), "seed")


@pytest.mark.parametrize("value", [(0.2, NAN, -0.2), (INF, 0.0, 0.0), (0.3,), (), [[0.1, 0.2]]])
def test_bad_init_logits(value):
    _raises(lambda: PPOConfig(init_logits=value), "init_logits")


def test_valid_edge_values_are_accepted():
    config = PPOConfig(beta=1e-6, epsilon=0.999, batch_size=1, iterations=1, epochs=1, seed=0)
    assert config.batch_size == 1 and config.epsilon == 0.999


# ---------------------------------------------------------------------------------------------
# train / sweeps


SMALL = PPOConfig(iterations=2, batch_size=4, epochs=1)


@pytest.mark.parametrize("rewards", [[1.0, 2.0], [1.0, 2.0, 3.0, 4.0], [[1.0, 2.0, 3.0]]])
def test_rewards_shape_must_match_init_logits(rewards):
    _raises(lambda: trainer.train(SMALL, rewards), "rewards")


def test_mismatched_rewards_message_says_so():
    _raises(lambda: trainer.train(SMALL, [1.0, 2.0]), "rewards", "mismatched")


@pytest.mark.parametrize("rewards", [[1.0, NAN, 0.0], [INF, 0.0, 0.0]])
def test_non_finite_rewards(rewards):
    _raises(lambda: trainer.train(SMALL, rewards), "rewards")


def test_train_needs_a_config():
    _raises(lambda: trainer.train({"beta": 0.2}), "config")


@pytest.mark.parametrize("betas", [[0.1, 0.0], [-1.0], [0.1, NAN], [], [[0.1]]])
def test_sweep_grid_bad_betas(betas):
    _raises(lambda: sweep.sweep_grid(SMALL, betas, [0.2]), "betas")


@pytest.mark.parametrize("epsilons", [[0.2, 1.0], [0.0], [INF], []])
def test_sweep_grid_bad_epsilons(epsilons):
    _raises(lambda: sweep.sweep_grid(SMALL, [0.2], epsilons), "epsilons")


def test_sweep_grid_mismatched_rewards():
    _raises(lambda: sweep.sweep_grid(SMALL, [0.2], [0.2], rewards=[1.0, 2.0]), "rewards")


@pytest.mark.parametrize("seeds", [[-1, 2], [0.5, 1.0], [], [[1, 2]]])
def test_sweep_seeds_bad_seeds(seeds):
    _raises(lambda: sweep.sweep_seeds(SMALL, seeds), "seeds")


# ---------------------------------------------------------------------------------------------
# Reward fit


def test_fit_reward_index_out_of_range():
    _raises(lambda: reward.fit_reward(chosen_idx=[0, 0, 3]), "chosen_idx")
    _raises(lambda: reward.fit_reward(rejected_idx=[1, -1, 2]), "rejected_idx")


def test_fit_reward_non_integer_indices():
    _raises(lambda: reward.fit_reward(chosen_idx=[0.0, 0.5, 1.0]), "chosen_idx")


def test_fit_reward_mismatched_pairs():
    _raises(lambda: reward.fit_reward(chosen_idx=[0, 0], rejected_idx=[1, 2, 2]), "chosen_idx", "rejected_idx")


def test_fit_reward_empty_indices():
    empty = np.array([], dtype=int)
    _raises(lambda: reward.fit_reward(chosen_idx=empty, rejected_idx=empty), "chosen_idx")


def test_fit_reward_bad_features_steps_and_rate():
    _raises(lambda: reward.fit_reward(features=[[1.0, NAN], [0.0, 1.0], [-1.0, -1.0]]), "features")
    _raises(lambda: reward.fit_reward(features=[1.0, 0.0, -1.0]), "features")
    _raises(lambda: reward.fit_reward(steps=0), "steps")
    _raises(lambda: reward.fit_reward(learning_rate=0.0), "learning_rate")
    _raises(lambda: reward.fit_reward(learning_rate=NAN), "learning_rate")


# ---------------------------------------------------------------------------------------------
# Plot / export entry points


class _OneRun:
    reward = np.array([0.5, 0.7])
    kl = np.array([0.01, 0.02])
    probs = np.array([[0.5, 0.3, 0.2], [0.6, 0.25, 0.15]])
    clip_frac = np.array([0.0, 0.1])
    ref_logp = np.log(np.array([0.4, 0.35, 0.25]))
    initial_reward = 0.3


def test_plot_rejects_bad_beta_and_rewards():
    _raises(lambda: plots.three_panel_figure(_OneRun, [1.0, 0.0, -1.0], 0.0), "beta")
    _raises(lambda: plots.three_panel_figure(_OneRun, [1.0, 0.0], 0.2), "rewards")
    _raises(lambda: plots.three_panel_figure(_OneRun, [1.0, NAN, 0.0], 0.2), "rewards")


def test_plot_rejects_a_sweep_result():
    class Batched(_OneRun):
        reward = np.zeros((2, 2))
    _raises(lambda: plots.three_panel_figure(Batched, [1.0, 0.0, -1.0], 0.2), "result")


def test_export_rejects_unknown_extension(tmp_path):
    _raises(lambda: plots.export_run(tmp_path / "run.txt", SMALL, _OneRun, {}), "path")


def test_export_refuses_non_finite_numbers(tmp_path):
    class Broken(_OneRun):
        kl = np.array([0.01, math.nan])
    with pytest.raises(ValueError):
        plots.export_run(tmp_path / "run.json", SMALL, Broken, {})


def test_seeds_beyond_32_bits_are_rejected_not_aliased():
    # JAX keeps 32 bits of a seed: 2**32 + 1 would silently replay seed 1
    _raises(lambda: PPOConfig(seed=2**32 + 1), "seed")
    _raises(lambda: sweep.sweep_seeds(SMALL, [1, 2**32 + 1]), "seeds")
    assert PPOConfig(seed=2**32 - 1).seed == 2**32 - 1
