"""What the PPO explorer computes: the parameter table, one run per setting, the beta x epsilon map.

Pure computation. Nothing here knows about widgets or figures: this module imports JAX, NumPy and
the course library only (never ``ipywidgets``, ``IPython``, ``matplotlib`` or ``PIL``; a test
imports it and runs it in a fresh interpreter and checks ``sys.modules``). Its results are plain
Python and NumPy values, which :mod:`.view` draws and :mod:`.wiring` passes along.

*No recompilation for beta/epsilon/lr/seed.* :meth:`ExplorerModel.run` calls the program cached by
:func:`rlhf_lab.trainer.make_train` ``(iterations, batch_size, epochs)`` exactly as
:func:`rlhf_lab.trainer.train` does (same key, same float32 traced scalars; the numbers are
identical); beta, epsilon and the learning rate are traced arguments and the seed only changes the
PRNG key *value*. The headline numbers come from a small jitted function of the run's outputs with
a traced beta (:func:`summary_numbers`). Only a new shape traces and compiles, once per shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import checks
from ..ppo import categorical_kl, expected_reward, optimal_logp, regularised_objective
from ..sweep import sweep_grid
from ..trainer import TRACE_COUNTS, PPOConfig, lesson_rewards, make_train

__all__ = ["ExplorerModel", "ParamSpec", "PARAMS", "SPECS", "summary_numbers", "grid_axes"]


# --------------------------------------------------------------------------------------------
# Parameter table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamSpec:
    """One slider: the :class:`PPOConfig` field it sets, its range and how it may be changed.

    ``role`` says what a change costs: ``"traced"`` (beta, epsilon: new run, same program, map
    unchanged), ``"grid"`` (learning rate, seed: new run and a new map, same programs) or
    ``"shape"`` (rollouts, batch size, epochs: may compile once per new shape).
    """

    name: str
    label: str
    kind: str  # "float" | "int"
    low: float
    high: float
    step: float
    log: bool
    role: str
    fmt: str

    def validate(self, text: Any):
        """Parse and check a typed value; return it as float/int or raise ``ValueError``.

        The library's checks (:mod:`rlhf_lab.checks`) run first, so their messages are the ones a
        student sees for values that are invalid for PPO itself (beta <= 0, epsilon outside (0, 1),
        a fractional batch size ...); then the explorer's own slider range is enforced.
        """
        raw = text.strip() if isinstance(text, str) else text
        if isinstance(raw, str) and raw == "":
            raise ValueError(f"{self.name} needs a value (the box is empty)")
        if self.kind == "float":
            value = checks.finite_scalar(self.name, raw)
            if self.name == "beta":
                value = checks.beta(value)
            elif self.name == "epsilon":
                value = checks.epsilon(value)
            elif self.name == "learning_rate":
                value = checks.learning_rate(value)
        else:
            if isinstance(raw, str):
                try:
                    raw = int(raw)
                except ValueError:
                    try:
                        as_float = float(raw)
                    except ValueError:
                        pass
                    else:
                        raw = as_float
            minimum = 0 if self.name == "seed" else 1
            value = checks.positive_int(self.name, raw, minimum=minimum)
        if not self.low <= value <= self.high:
            raise ValueError(
                f"{self.name} = {value:{self.fmt}} is outside this explorer's range "
                f"[{self.low:{self.fmt}}, {self.high:{self.fmt}}]"
            )
        return value


#: The sliders, in display order. Ranges cover the lesson's values with room on both sides.
PARAMS: tuple[ParamSpec, ...] = (
    ParamSpec("beta", "β (KL coef.)", "float", 0.01, 10.0, 0.05, True, "traced", ".6g"),
    ParamSpec("epsilon", "ε (clip range)", "float", 0.01, 0.95, 0.01, False, "traced", ".6g"),
    ParamSpec("learning_rate", "learning rate", "float", 0.01, 1.0, 0.05, True, "grid", ".6g"),
    ParamSpec("epochs", "inner epochs", "int", 1, 10, 1, False, "shape", "d"),
    ParamSpec("batch_size", "batch size", "int", 8, 512, 1, False, "shape", "d"),
    ParamSpec("iterations", "rollouts", "int", 5, 100, 1, False, "shape", "d"),
    ParamSpec("seed", "seed", "int", 0, 999, 1, False, "grid", "d"),
)
SPECS: dict[str, ParamSpec] = {p.name: p for p in PARAMS}


# --------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------


_SCALARS = ("initial_reward", "objective_reference", "objective_trained", "objective_optimum",
            "optimum_reward", "optimum_kl")


def _summary_core(result, rewards, beta):
    """Headline numbers of a run, packed into ONE float32 vector (one device-to-host copy).

    Same formulas as :func:`rlhf_lab.lesson.summarise`: ``J(pi) = E_pi[r] - beta KL(pi || pi_ref)``
    for the reference, the trained policy and the analytic optimum
    ``pi* = softmax(ref_logp + r / beta)`` (log space). Layout: the six :data:`_SCALARS`, then
    ``final_probs[n]``, ``optimum_probs[n]``, ``reference_probs[n]``, then the per-rollout series
    ``reward[T]``, ``kl[T]``, ``clip_frac[T]``. ``beta`` is traced (a new beta never recompiles);
    a new ``T`` or ``n`` traces once.
    """
    TRACE_COUNTS["explorer_summary"] += 1
    ref_logp = result.ref_logp
    final_logp = jax.nn.log_softmax(result.final_logits)
    opt_logp = optimal_logp(ref_logp, rewards, beta)
    scalars = jnp.stack([
        result.initial_reward,
        regularised_objective(ref_logp, rewards, ref_logp, beta),
        regularised_objective(final_logp, rewards, ref_logp, beta),
        regularised_objective(opt_logp, rewards, ref_logp, beta),
        expected_reward(opt_logp, rewards),
        categorical_kl(opt_logp, ref_logp),
    ])
    return jnp.concatenate([
        scalars, result.probs[-1], jnp.exp(opt_logp), jnp.exp(ref_logp),
        result.reward, result.kl, result.clip_frac,
    ])


_summary_jit = jax.jit(_summary_core)


def summary_numbers(result, rewards, beta: float) -> dict:
    """Plain-Python numbers of one :class:`rlhf_lab.trainer.TrainResult` (what the readout shows).

    Keys: ``initial_reward``, ``final_reward``, ``final_kl`` (nats), ``objective_reference``,
    ``objective_trained``, ``objective_optimum``, ``gap`` (optimum - trained, >= 0 up to float
    error), ``clip_fraction`` (fraction of last-batch samples whose ratio left ``[1-eps, 1+eps]``,
    averaged over that batch's inner epochs), ``optimum_reward``, ``optimum_kl`` and the
    ``final_probs``/``optimum_probs``/``reference_probs`` lists, plus the per-rollout ``reward``,
    ``kl`` and ``clip_frac`` series as NumPy arrays.
    """
    packed = np.asarray(jax.device_get(_summary_jit(result, rewards, np.float32(beta))))
    n = int(result.final_logits.shape[-1])
    k = len(_SCALARS)
    out = {name: float(v) for name, v in zip(_SCALARS, packed[:k])}
    out["final_probs"] = packed[k:k + n].tolist()
    out["optimum_probs"] = packed[k + n:k + 2 * n].tolist()
    out["reference_probs"] = packed[k + 2 * n:k + 3 * n].tolist()
    reward, kl, clip_frac = np.split(packed[k + 3 * n:], 3)
    out.update(reward=reward, kl=kl, clip_frac=clip_frac)
    out["final_reward"] = float(reward[-1])
    out["final_kl"] = float(kl[-1])
    out["clip_fraction"] = float(clip_frac[-1])
    out["gap"] = out["objective_optimum"] - out["objective_trained"]
    return out


def grid_axes(n_beta: int, n_eps: int):
    """Cell edges/centres of the map so the cells exactly tile the sliders' ranges.

    beta is geometric (log axis), epsilon linear. Returns (beta_edges[B+1], beta_centres[B],
    eps_edges[E+1], eps_centres[E]).
    """
    b, e = SPECS["beta"], SPECS["epsilon"]
    beta_edges = np.geomspace(b.low, b.high, n_beta + 1)
    eps_edges = np.linspace(e.low, e.high, n_eps + 1)
    beta_centres = np.sqrt(beta_edges[:-1] * beta_edges[1:])
    eps_centres = 0.5 * (eps_edges[:-1] + eps_edges[1:])
    return beta_edges, beta_centres, eps_edges, eps_centres


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class ExplorerModel:
    """The runs behind the explorer for one start policy and one reward vector.

    Args:
      init_logits: the start (= reference) policy's logits (a :class:`PPOConfig` field).
      rewards: ``[n_actions]`` frozen rewards (default: the lesson's fitted reward model).
      grid_size: ``(n_beta, n_epsilon)`` cells of the map (one vmapped ``sweep_grid`` call).

    Attributes: ``init_logits`` (tuple), ``rewards`` (float32 JAX array), the map's
    ``beta_edges``/``grid_betas``/``eps_edges``/``grid_epsilons`` (NumPy).
    """

    def __init__(self, init_logits, rewards=None, grid_size=(16, 16)):
        self.init_logits = tuple(init_logits)
        self._init_logits = jnp.asarray(self.init_logits, jnp.float32)
        self._keys: dict[int, Any] = {}
        rewards = lesson_rewards() if rewards is None else rewards
        self.rewards = jnp.asarray(
            checks.finite_vector("rewards", rewards, size=len(self.init_logits)), jnp.float32
        )
        n_beta, n_eps = (int(grid_size[0]), int(grid_size[1]))
        if n_beta < 2 or n_eps < 2:
            raise ValueError(f"grid_size must be at least (2, 2), got {grid_size!r}")
        self.beta_edges, self.grid_betas, self.eps_edges, self.grid_epsilons = grid_axes(n_beta, n_eps)

    @staticmethod
    def initial_values(config: PPOConfig) -> dict:
        """The slider values of ``config``, each validated like a typed value."""
        return {spec.name: spec.validate(getattr(config, spec.name)) for spec in PARAMS}

    def reference_probs(self) -> np.ndarray:
        """``pi_ref`` as a NumPy vector (fixes the KL axis range of the figure)."""
        return np.exp(np.asarray(jax.nn.log_softmax(jnp.asarray(self.init_logits, jnp.float32))))

    def config_for(self, params: dict) -> PPOConfig:
        """The validated :class:`PPOConfig` for slider values ``params``."""
        return PPOConfig(init_logits=self.init_logits, **params)

    def run(self, params: dict) -> dict:
        """Run the compiled trainer for slider values ``params``; return its numbers.

        The returned dict is :func:`summary_numbers` plus ``params`` (a copy) and ``diverged``.
        """
        params = dict(params)
        config = self.config_for(params)
        # Exactly what rlhf_lab.trainer.train(config, rewards) does, minus its per-call eager
        # conversions (the rewards were validated once; keys and arrays are cached): the program
        # cached by make_train(*shape), hyperparameters as float32 traced scalars.
        result = make_train(*config.shape)(
            self._key(config.seed),
            self._init_logits,
            self.rewards,
            np.float32(config.beta),
            np.float32(config.epsilon),
            np.float32(config.learning_rate),
        )
        summary = summary_numbers(result, self.rewards, config.beta)
        summary["params"] = params
        summary["diverged"] = not all(
            math.isfinite(summary[k]) for k in ("final_reward", "final_kl", "objective_trained")
        )
        return summary

    def _key(self, seed: int):
        key = self._keys.get(seed)
        if key is None:
            if len(self._keys) > 256:
                self._keys.clear()
            key = self._keys[seed] = jax.random.key(seed)
        return key

    @staticmethod
    def grid_key(params: dict):
        """What the map depends on: the shape, the seed and the learning rate (not beta/epsilon)."""
        return (params["iterations"], params["batch_size"], params["epochs"], params["seed"],
                params["learning_rate"])

    def grid(self, params: dict):
        """One vmapped :func:`sweep_grid` over the map's beta x epsilon cells (NumPy results)."""
        grid = sweep_grid(self.config_for(dict(params)), self.grid_betas, self.grid_epsilons, self.rewards)
        return jax.device_get(grid)
