"""rlhf_lab: the JAX helper library of the RLHF policy-optimisation course.

Reward model (:mod:`.reward`), PPO pieces (:mod:`.ppo`), the compiled trainer (:mod:`.trainer`),
sweeps (:mod:`.sweep`), plots and data export (:mod:`.plots`) and the lesson run (:mod:`.lesson`).
"""
from .ppo import (
    categorical_kl,
    clip_fraction,
    clipped_surrogate,
    enumerated_baseline_gradient,
    exact_advantages,
    exact_reward_gradient,
    expected_reward,
    optimal_logp,
    ppo_loss,
    regularised_objective,
    reward_kl_frontier,
)
from .reward import FittedReward, fit_reward, preference_loss
from .trainer import TRACE_COUNTS, PPOConfig, TrainResult, lesson_rewards, make_train, train
from .sweep import GridResult, sweep_grid, sweep_seeds

__version__ = "0.1.0"

__all__ = [
    "categorical_kl", "clip_fraction", "clipped_surrogate", "enumerated_baseline_gradient",
    "exact_advantages", "exact_reward_gradient", "expected_reward", "optimal_logp", "ppo_loss",
    "regularised_objective", "reward_kl_frontier", "FittedReward", "fit_reward", "preference_loss", "TRACE_COUNTS",
    "PPOConfig", "TrainResult", "lesson_rewards", "make_train", "train", "GridResult",
    "sweep_grid", "sweep_seeds",
]
