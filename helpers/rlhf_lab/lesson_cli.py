"""Run the lesson's PPO experiment headless and check it against the recorded reference execution.

    python -m rlhf_lab.lesson_cli --out DIR

Trains with the compiled trainer on the lesson configuration (key 11, 40 rollouts of 128 samples,
3 inner steps, lr 0.15, beta 0.2, epsilon 0.2, reference logits [0.2, 0, -0.2]), prints every number
the lesson prints, in the lesson's order, next to the recorded value and the absolute difference,
and writes ``figure.png`` (the 3-panel figure), ``run.json`` and ``run.csv`` (data + provenance)
into DIR. Exit status 0 when every number is within the tolerance (1e-5), 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from . import plots
from .lesson import RECORDED, run_lesson
from .ppo import categorical_kl, clipped_surrogate, enumerated_baseline_gradient, exact_reward_gradient, ppo_loss
from .trainer import PPOConfig, lesson_rewards

TOLERANCE = 1e-5

#: The lesson's probe logits for the baseline-cancellation check.
BASELINE_PROBE_LOGITS = (0.3, -0.2, 0.1)


def lesson_checks(config: PPOConfig = PPOConfig()) -> tuple[list[tuple[str, float, float]], object, dict, object]:
    """Run the lesson and return ``(rows, result, summary, rewards)``.

    Each row is ``(label, measured, recorded)``; a row passes when ``|measured - recorded| <= 1e-5``.
    Rows come in the lesson's printing order.
    """
    rewards = lesson_rewards()
    ref_before = np.asarray(jax.nn.log_softmax(jnp.asarray(config.init_logits, jnp.float32))).copy()
    result, summary = run_lesson(config)
    rows: list[tuple[str, float, float]] = []

    # 1. reward initial/final and final KL
    rows.append(("reward, initial (score units)", summary["initial_reward"], RECORDED["initial_reward"]))
    rows.append(("reward, final (score units)", summary["final_reward"], RECORDED["final_reward"]))
    rows.append(("KL to reference, final (nats)", summary["final_kl"], RECORDED["final_kl"]))
    ref_change = float(np.max(np.abs(np.asarray(result.ref_logp) - ref_before)))
    rows.append(("reference log-probs, max change", ref_change, 0.0))

    # 2. both clipping directions: (rho, A) = (1.5, 2) and (0.5, -2), epsilon 0.2
    terms = np.asarray(clipped_surrogate(jnp.array([1.5, 0.5]), jnp.array([2.0, -2.0]), 0.2))
    for term, want in zip(terms, RECORDED["clip_terms"]):
        rows.append((f"clipped surrogate term (recorded {want:+.1f})", float(term), float(want)))

    # 3. baseline cancellation by enumeration: max |enumerated - exact| over the gradient entries
    probe = jnp.asarray(BASELINE_PROBE_LOGITS, jnp.float32)
    baseline = jnp.sum(jax.nn.softmax(probe) * rewards)
    gap = enumerated_baseline_gradient(probe, rewards, baseline) - exact_reward_gradient(probe, rewards)
    rows.append(("baseline gradient, max |enumerated - exact|", float(jnp.max(jnp.abs(gap))), 0.0))

    # 4. KL at the reference (exactly zero) and at the final policy
    zero_kl = float(categorical_kl(result.ref_logp, result.ref_logp))
    rows.append(("KL at the reference (nats)", zero_kl, 0.0))
    rows.append(("KL at the final policy (nats)", summary["final_kl"], RECORDED["final_kl"]))

    # 5. behaviour log-probs and advantages are constants of the loss
    g_old, g_adv = jax.grad(ppo_loss, argnums=(1, 3))(
        result.final_logits, result.last_old_logp, result.last_actions, result.last_advantages,
        result.ref_logp, config.beta, config.epsilon,
    )
    rows.append(("max |d loss / d old_logp|", float(jnp.max(jnp.abs(g_old))), 0.0))
    rows.append(("max |d loss / d advantages|", float(jnp.max(jnp.abs(g_adv))), 0.0))

    # 6. regularised objective E[r] - beta KL: reference / trained / analytic optimum
    for key, label in (("objective_reference", "reference"), ("objective_trained", "trained"), ("objective_optimum", "optimum")):
        rows.append((f"regularised objective, {label}", summary[key], RECORDED[key]))
    return rows, result, summary, rewards


def format_table(rows, tolerance: float = TOLERANCE) -> tuple[str, bool]:
    """Render rows as an aligned text table; also return whether every row is within tolerance."""
    lines = [f"{'quantity':46s} {'measured':>14s} {'recorded':>14s} {'|diff|':>10s}  ok"]
    all_ok = True
    for label, measured, recorded in rows:
        diff = abs(measured - recorded)
        ok = bool(np.isfinite(measured)) and diff <= tolerance
        all_ok &= ok
        lines.append(f"{label:46s} {measured:14.8f} {recorded:14.8f} {diff:10.2e}  {'ok' if ok else 'FAIL'}")
    return "\n".join(lines), all_ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.lesson_cli", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo_out", help="folder for figure.png, run.json and run.csv")
    args = parser.parse_args(argv)

    config = PPOConfig()
    print(
        f"Lesson PPO run (JAX {jax.__version__}, {jax.default_backend()}, float32): key {config.seed}, "
        f"{config.iterations} rollouts x {config.batch_size} samples, {config.epochs} inner steps, "
        f"lr {config.learning_rate}, beta {config.beta}, epsilon {config.epsilon}, "
        f"reference logits {list(config.init_logits)}"
    )
    rows, result, summary, rewards = lesson_checks(config)
    table, ok = format_table(rows)
    print(table)

    os.makedirs(args.out, exist_ok=True)
    fig = plots.three_panel_figure(result, rewards, config.beta, optimum_probs=summary["optimum_probs"])
    fig.savefig(os.path.join(args.out, "figure.png"), dpi=120)
    for name in ("run.json", "run.csv"):
        plots.export_run(os.path.join(args.out, name), config, result, summary, rewards=rewards)
    print(f"wrote {os.path.join(args.out, 'figure.png')}, run.json and run.csv")
    if ok:
        print(f"PASS: every number within {TOLERANCE:g} of the recorded reference execution")
        return 0
    print(f"FAIL: some numbers differ from the recorded reference execution by more than {TOLERANCE:g}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
