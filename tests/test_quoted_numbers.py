"""Numbers the lessons' prose quotes from a cell's output are the numbers that cell computes.

:data:`QUOTES` is the table: one row per prose snippet that quotes numbers, with the notebook
(``content/<assignment>/<name>.py``, the source of truth), the markdown cell (its grade_id) holding the
snippet, the code cell whose output the snippet quotes, and for each quoted number either the code
that recomputes it from that cell's namespace (an expression, or a function of the namespace) or
``None``: the number, as quoted, must appear in what that cell prints.

* Fast (no kernel): every snippet is in its prose cell and every quoted number is in its snippet, so
  an edit of the prose that drops or changes a quote also changes this table.
* Slow: each notebook's code cells run in this process, in order (test cells, the start cell, the
  explorers and the file export left out; the cells skipped "while autograding" run), and every quoted
  number is compared with the recomputed one to the precision of the quote (0.073 means
  within 0.0005 of the computed value). A stale quote fails with the number the cell now gives.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
CONTENT = REPO / "content"

#: code cells never run here: the grader's start cell, the explorers, the file export
SKIP_CELLS = {"export_cell", "explorer_cell", "explorer_seq"}


@dataclass(frozen=True)
class Quote:
    notebook: str            # content/<notebook>.py
    prose: str               # grade_id of the markdown cell holding the snippet
    snippet: str             # the prose, as written (line breaks and comment marks ignored)
    cell: str                # grade_id of the code cell whose output is quoted
    numbers: tuple           # (quoted text, expression | function(ns) | None = printed verbatim by `cell`)
    source: str = ""         # the notebook of `cell`, when it is not `notebook` (a model answer quoting notebook 1)

    @property
    def runs_in(self) -> str:
        return self.source or self.notebook


# ------------------------------------------------------------------------------------------------
# helpers that recompute a quoted number from a notebook's namespace


def _batch_ratio(ns, B, leave_one_out):
    """a2 04: E[batch gradient] / exact gradient with a batch-mean baseline, enumerated (all components equal)."""
    batches = np.array(list(itertools.product(range(3), repeat=B)))
    weights = np.prod(ns["probe_probs"][batches], axis=1)
    r = np.asarray(ns["rewards"])[batches]
    base = ((r.sum(axis=1, keepdims=True) - r) / (B - 1) if leave_one_out
            else np.repeat(r.mean(axis=1, keepdims=True), B, axis=1))
    mean = sum(w * np.asarray(ns["batch_gradient"](a, b)) for w, a, b in zip(weights, batches, base))
    ratio = mean / ns["exact"]
    assert np.allclose(ratio, ratio[0], atol=1e-5), ratio
    return float(ratio[0])


def _fit_rmse(ns, form, curve):
    """a3 03: root-mean-square error of a least-squares fit, as the overopt_fit_errors cell prints it."""
    kl, gold = ns["curves"][curve]
    d = np.sqrt(np.maximum(kl, 0.0))
    X = ns["forms"][form](d)
    gain = gold - ns["reference"]["gold"]
    return float(np.sqrt(np.mean((gain - X @ np.linalg.lstsq(X, gain, rcond=None)[0]) ** 2)))


def _gold_term(ns, row, term):
    """a3 03: exact E[term] under the policy of row ``row`` of the gold_decomposition table (0: reference)."""
    probs = np.exp(np.asarray(ns["policies"][row][2], np.float64))
    if term == "gold":
        return float(sum(np.mean(np.sum(probs * v, axis=1)) for v in ns["terms"].values()))
    return float(np.mean(np.sum(probs * ns["terms"][term], axis=1)))


def _at_least(bound, value):
    """A quote "above ``bound``": ``bound`` itself while ``value`` is above it, else ``value`` (which then fails)."""
    value = float(value)
    return bound if value > bound else value


def _at_most(bound, value):
    """A quote "within ``bound``": ``bound`` itself while ``value`` is at most it, else ``value``."""
    value = float(value)
    return bound if value <= bound else value


def _near(target, value, within):
    """A quote "near ``target``": ``target`` while ``value`` is within ``within`` of it, else ``value``."""
    value = float(value)
    return target if abs(value - target) <= within else value


def _policy_mean(ns, row, table):
    """a3 03: exact E[table] (a [P, R] or [R] table) under the policy of row ``row`` of gold_decomposition."""
    probs = np.exp(np.asarray(ns["policies"][row][2], np.float64))
    table = np.broadcast_to(np.asarray(table, np.float64), probs.shape)
    return float(np.mean(np.sum(probs * table, axis=1)))


def _truncated_share(ns, row):
    return _policy_mean(ns, row, 1.0 - ns["tree"].has_eos)


def _target_copies(ns, row):
    target = np.asarray(ns["task"].gold.target)
    return _policy_mean(ns, row, np.asarray(ns["tree"].counts)[:, target].T)


def _peak(ns):
    return int(np.argmax(ns["opt_gold"]))


def _gold_change(ns, term, start, end):
    """a3 03: change of one gold term between two rows of the table (row 0 reference, k + 1 the k-th beta)."""
    return _gold_term(ns, end, term) - _gold_term(ns, start, term)


def _reference_slope(ns, values):
    """a3 03: pooled within-prompt least-squares slope of ``values`` [P, R] on the length under the reference."""
    probs = np.exp(np.asarray(ns["task"].arrays.ref_resp_logp, np.float64))
    v = np.asarray(values, np.float64)
    length = np.broadcast_to(np.asarray(ns["lengths"], np.float64), v.shape)
    dv = v - np.sum(probs * v, axis=1, keepdims=True)
    dl = length - np.sum(probs * length, axis=1, keepdims=True)
    return float(np.sum(probs * dv * dl) / np.sum(probs * dl ** 2))


def _optimum_gold(ns, score, beta):
    sq = ns["sq"]
    return sq.length_bias.length_summary(ns["task"], sq.exact.optimal_logp(
        ns["task"].arrays.ref_resp_logp, ns["jnp"].asarray(score, ns["jnp"].float32), beta))["gold"]


def _normalised_gold_with_bonus(ns, bonus, beta):
    """a3 03: gold of the optimum of the length-normalised score of the proxy + ``bonus`` per token."""
    biased = ns["sq"].length_bias.with_length_bonus(ns["task"], bonus)
    score = ns["length_normalised_score"](biased.arrays.score, ns["lengths"], ns["task"].arrays.ref_resp_logp)
    return _optimum_gold(ns, score, beta)


def _at_iteration(result, iteration, field):
    steps = list(np.asarray(getattr(result, "eval_step", None) if hasattr(result, "eval_step")
                            else result.eval_iteration))
    return float(np.asarray(getattr(result, field))[steps.index(iteration)])


def _dpo_term(ns, term, which):
    """a3 03: the dpo_gold_terms table: E[term] of DPO after 1000 steps, or of the pi*_beta nearest in KL."""
    sq, task = ns["sq"], ns["task"]
    if which == "dpo":
        logp = ns["dpo_logp"]
    else:
        logp = sq.exact.optimal_logp(task.arrays.ref_resp_logp, task.arrays.score, float(ns["betas"][ns["near_kl"]]))
    probs = np.exp(np.asarray(logp, np.float64))
    return float(np.mean(np.sum(probs * ns["terms"][term], axis=1)))


A1_01 = "a1_ppo_objective/01_clipped_objective"
A1 = "a1_ppo_objective/02_kl_penalty_and_review"
A2_01 = "a2_ppo_rlhf/01_losses"
A3_01 = "a3_ppo_sequences/01_masks_and_sft"
A2_03 = "a2_ppo_rlhf/03_rollouts"
A2_04 = "a2_ppo_rlhf/04_make_it_yours"
A3_03 = "a3_ppo_sequences/03_loop_and_analysis"

QUOTES = (
    # ---- a1, notebook 1: the model answer of Task 1.5 quotes show_capped
    Quote(A1_01, "ex3_explanation", "unclipped 2.7000, clipped 1.8000, the clip removes 0.9000 (33% of the incentive)",
          "show_capped", (("2.7000", "float(u)"), ("1.8000", "float(c)"), ("0.9000", "float(lost)"),
                          ("33", "100 * float(lost / u)"))),
    Quote(A1_01, "ex3_explanation", "ratio 1.8 and A = 1.5 give unclipped 2.7 but clipped 1.8", "show_capped",
          (("2.7", "float(u)"), ("1.8", "float(c)"))),
    # ---- a1, notebook 2: the model answers quote the printed tables (of notebook 1 too)
    Quote(A1, None, "For the far reference (KL ≈ 1.98 nats)", "show_kl", (("1.98", "kl_far"),)),
    Quote(A1, "ex2_discussion", "For the far reference (KL = 1.9827589 nats)", "show_kl", (("1.9827589", "kl_far"),)),
    Quote(A1, "ex2_discussion", "for KL about 1.98 nats, beta 0.01 / 0.1 / 0.5 / 1.0 consume about 2 % / 20 % / 99 % / 198 %",
          "show_beta", (("1.98", "kl_far"), ("2", "100 * float(share[0])"), ("20", "100 * float(share[1])"),
                        ("99", "100 * float(share[2])"), ("198", "100 * float(share[3])"))),
    Quote(A1, "ex2_discussion", "(penalised 0.980 / 0.802 / 0.009 / -0.983)", "show_beta",
          tuple((q, f"float(penalised[{i}])") for i, q in enumerate(("0.980", "0.802", "0.009", "-0.983")))),
    Quote(A1, "challenge_answer", "ratio 1.8 with $A = +1$ gives unclipped +1.8000 but clipped +1.2000", "show_table",
          (("+1.8000", "float(unclipped[0])"), ("+1.2000", "float(clipped[0])")), source=A1_01),
    Quote(A1, "challenge_answer", "the sweep puts the boundary at 1.20 (the grid ratios 1.25 to 2.00 all diverge)", "ex1_sweep",
          (("1.20", "clip_boundary(EPSILON, 1.0)"),
           ("1.25", "float(DEFAULT_RATIOS[np.asarray(np.abs(ppo_surrogate(DEFAULT_RATIOS, 1.0, EPSILON, clip=False)"
                    " - ppo_surrogate(DEFAULT_RATIOS, 1.0, EPSILON)) > DIVERGE_TOL)].min())"),
           ("2.00", "float(DEFAULT_RATIOS[-1])")), source=A1_01),
    Quote(A1, "challenge_answer", "the gradient column gives d/d ratio = +0.00 for that row", "show_gradients",
          (("+0.00", "float(grads[0])"),)),
    Quote(A1, "challenge_answer", "Ratio 1.8 with $A = -1$ keeps the full −1.8000 (not −1.2) and its gradient is −1.00",
          "show_gradients", (("−1.8000", "float(values[2])"), ("−1.00", "float(grads[2])"))),
    Quote(A1, "challenge_answer", "ratio 1.8, A = +1 gives unclipped 1.8 but clipped 1.2", "show_table",
          (("1.8", "float(unclipped[0])"), ("1.2", "float(clipped[0])")), source=A1_01),
    Quote(A1, "challenge_answer", "ratio 1.8 with A = -1 keeps the full -1.8 (not -1.2)", "show_table",
          (("-1.8", "float(clipped[2])"),), source=A1_01),
    Quote(A1, "cyu_q2", "my sweep found the boundaries 1.20 for $A > 0$ and 0.80 for $A < 0$", "ex1_sweep",
          (("1.20", "clip_boundary(EPSILON, 1.0)"), ("0.80", "clip_boundary(EPSILON, -1.0)")), source=A1_01),
    Quote(A1, "cyu_q3", "(my table printed +1.8000 and +1.2000, diverge=True)", "show_table",
          (("+1.8000", "float(unclipped[0])"), ("+1.2000", "float(clipped[0])")), source=A1_01),
    Quote(A1, "cyu_q4", "(my table printed −1.8000 for both, diverge=False", "show_table",
          (("−1.8000", "float(unclipped[2])"), ("−1.8000", "float(clipped[2])")), source=A1_01),
    Quote(A1, "cyu_q4", "and the gradient stays −1)", "show_gradients", (("−1", "float(grads[2])"),)),
    Quote(A1, "cyu_q5", "close reference KL about 0.0072 nats gives 0.99928", "show_kl",
          (("0.0072", "kl_close"), ("0.99928", "float(penalized_reward(RAW_REWARD, BETA, kl_close))"))),
    Quote(A1, "cyu_q5", "far reference KL about 1.98 nats gives 0.80172", "show_kl",
          (("1.98", "kl_far"), ("0.80172", "float(penalized_reward(RAW_REWARD, BETA, kl_far))"))),
    Quote(A1, "ex2_discussion", "printed: β = 0.01 consumes 1.98% (penalised +0.98017), β = 0.1 consumes 19.83% (+0.80172),",
          "show_beta", (("1.98", "100 * float(share[0])"), ("+0.98017", "float(penalised[0])"),
                        ("19.83", "100 * float(share[1])"), ("+0.80172", "float(penalised[1])"))),
    Quote(A1, "ex2_discussion", "β = 0.5 consumes 99.14% (+0.00862) and β = 1.0 consumes 198.28% (−0.98276).",
          "show_beta", (("99.14", "100 * float(share[2])"), ("+0.00862", "float(penalised[2])"),
                        ("198.28", "100 * float(share[3])"), ("−0.98276", "float(penalised[3])"))),
    Quote(A1, "challenge_answer", "[0.093956, −0.049622, −0.032211, −0.012122]", "show_clipped_kl",
          tuple((q, f"float(with_kl[{i}])") for i, q in enumerate(("0.093956", "−0.049622", "−0.032211", "−0.012122")))),
    Quote(A1, "cyu_q5", "the close reference (KL = 0.0072039 nats) leaves a penalised reward of 0.99928,",
          "show_kl", (("0.0072039", "kl_close"), ("0.99928", "float(penalized_reward(RAW_REWARD, BETA, kl_close))"))),
    Quote(A1, "cyu_q5", "the far reference (KL = 1.9827589 nats) leaves 0.80172,",
          "show_kl", (("1.9827589", "kl_far"), ("0.80172", "float(penalized_reward(RAW_REWARD, BETA, kl_far))"))),
    # ---- a2, notebook 3: the two clip fractions on the lesson's batch
    Quote(A2_03, None, "reach the best single action's reward (about 1.98)", "imports_03",
          (("1.98", "float(np.max(rewards))"),)),
    Quote(A2_03, "read_diagnostics_03", "0 at step 1, then 1.000: after one step", "diagnostics_experiment",
          (("0", "diag['clip_frac'][0]"), ("1.000", "diag['clip_frac'][1]"))),
    Quote(A2_03, "read_clip_binds_03", "Action 1 has a small positive advantage (+0.045)", "clip_binds_03",
          (("+0.045", "float(diag_adv[diag_actions == 1][0])"),)),
    Quote(A2_03, "read_clip_binds_03", "its ratio fell to 0.695", "clip_binds_03",
          (("0.695", "float(diag_ratio[1][diag_actions == 1][0])"),)),
    Quote(A2_03, "read_clip_binds_03", "For its 8 samples", "clip_binds_03",
          (("8", "int((diag_actions == 1).sum())"),)),
    Quote(A2_03, "read_clip_binds_03", "From step 2 on all 32 ratios are outside the band (1.000) while the clip binds on 24 of them (0.750).",
          "clip_binds_03", (("32", "int(outside_band[1].sum())"), ("1.000", "float(outside_band[1:].mean())"),
                            ("24", "int(clip_binds[1].sum())"), ("0.750", "float(clip_binds[1:].mean())"))),
    # ---- a2, notebook 4
    Quote(A2_04, "batch_baseline_read_04", "(0.5000, 0.6667, 0.7500 for", "batch_baseline_04",
          (("0.5000", lambda ns: _batch_ratio(ns, 2, False)), ("0.6667", lambda ns: _batch_ratio(ns, 3, False)),
           ("0.7500", lambda ns: _batch_ratio(ns, 4, False)))),
    Quote(A2_04, "batch_baseline_read_04", "so it is unbiased (1.0000)", "batch_baseline_04",
          (("1.0000", lambda ns: min(_batch_ratio(ns, B, True) for B in (2, 3, 4))),
           ("1.0000", lambda ns: max(_batch_ratio(ns, B, True) for B in (2, 3, 4))))),
    Quote(A2_04, "frontier_answer", "Every run ends below the curve, by 0.01 to 0.035 reward units at its own KL",
          "frontier_sweep_04", (("0.01", "-float(gap.max())"), ("0.035", "-float(gap.min())"))),
    Quote(A2_04, "frontier_answer", "the optimum is almost the best action (KL about 0.91 nats) while the runs stop near 0.62",
          "frontier_sweep_04", (("0.91", "float(own_kl[:3].mean())"), ("0.62", "float(run_kl[:3].min())"))),
    Quote(A2_04, "frontier_answer", "to 0.68 nats; at β = 1 the runs (about 0.4 nats) are closest", "frontier_sweep_04",
          (("0.68", "float(run_kl[:3].max())"), ("0.4", "float(run_kl[4].mean())"))),
    Quote(A2_04, "frontier_answer", "to their own point (0.50 nats)", "frontier_sweep_04", (("0.50", "float(own_kl[4])"),)),
    Quote(A2_04, "understanding_a2", "a gap remains (1.7620 vs 1.7988 here)", "objective_values_answer",
          (("1.7620", "objective_trained"), ("1.7988", "objective_optimum"))),
    # ---- a3, notebook 1: the SFT refit with and without EOS in the mask
    Quote(A3_01, "sft_refit_reveal", "a probability above 0.999 for every prompt of running to 6 tokens without EOS",
          "sft_refit", (("0.999", lambda ns: _at_least(0.999, np.min(ns["p_no_eos"]["EOS left out"]))),)),
    Quote(A3_01, "sft_refit_reveal", "against 0.43 to 0.76 with EOS counted", "sft_refit",
          (("0.43", "float(np.min(p_no_eos['EOS in the mask']))"), ("0.76", "float(np.max(p_no_eos['EOS in the mask']))"))),
    Quote(A3_01, "sft_refit_reveal", "the demonstrations themselves end with EOS 43% of the", "sft_refit",
          (("43", "100 * demo_eos_share"),)),
    # ---- a3, notebook 3: KL estimators far from the reference
    Quote(A3_03, None, "from the trained policy of section 3 (KL near 10 nats)", "experiment_loop",
          (("10", "float(run.kl[-1])"),)),
    Quote(A3_03, "kl_near_far_reveal", "the ratio is 8.6 for the trained policy and 0.2 near the reference", "kl_exact_spread",
          (("8.6", "exact_spread['the trained policy'][1] / exact_spread['the trained policy'][0]"),
           ("0.2", "exact_spread['near the reference'][1] / exact_spread['near the reference'][0]"))),
    # ---- a3, notebook 3: over-optimisation
    Quote(A3_03, "overopt_reading", "best-of-n's gold peaks at d = 1.58 (n = 32) and the quadratic puts its peak at 1.61;",
          "experiment_overopt", (("1.58", "float(np.sqrt(bon_kl)[np.argmax(bon_gold)])"),
                                 ("32", "2 ** int(np.argmax(bon_gold))"), ("1.61", "float(alpha / (2 * b))"))),
    Quote(A3_03, "overopt_reading", "peaks at d = 1.25 (beta = 0.30; the grid's neighbours are at 1.08 and 1.53) and the RL form puts its peak at 1.18.",
          "experiment_overopt", (("1.25", "float(d_opt[np.argmax(opt_gold)])"), ("0.30", "float(betas[np.argmax(opt_gold)])"),
                                 ("1.08", "float(d_opt[np.argmax(opt_gold) - 1])"),
                                 ("1.53", "float(d_opt[np.argmax(opt_gold) + 1])"),
                                 ("1.18", "float(np.exp(alpha_rl / b_rl - 1))"))),
    Quote(A3_03, "overopt_reading", "would say 1.64, which is not close to 1.25.", "experiment_overopt",
          (("1.64", "float(alpha_q / (2 * b_q))"), ("1.25", "float(d_opt[np.argmax(opt_gold)])"))),
    Quote(A3_03, "overopt_reading", "(errors of 0.161 and 0.195)", "overopt_fit_errors",
          (("0.161", lambda ns: _fit_rmse(ns, "d (alpha - b log d)", "pi*_beta")),
           ("0.195", lambda ns: _fit_rmse(ns, "alpha d - b d^2", "pi*_beta")))),
    Quote(A3_03, "overopt_reading", "the quadratic happens to do better than the RL form (0.079 against 0.143)",
          "overopt_fit_errors", (("0.079", lambda ns: _fit_rmse(ns, "alpha d - b d^2", "PPO run")),
                                 ("0.143", lambda ns: _fit_rmse(ns, "d (alpha - b log d)", "PPO run")))),
    Quote(A3_03, "seq_analysis_a1", "The gold reward of the optimum rises from -1.14 (the reference) to a peak of 0.16",
          "gold_decomposition", (("-1.14", "reference['gold']"), ("0.16", "float(opt_gold.max())"))),
    Quote(A3_03, "seq_analysis_a1", "at d = sqrt(KL) of about 1.25 (beta near 0.3) and then falls, to -1.61 at d = 3.8 (beta 0.02),",
          "gold_decomposition", (("1.25", "float(d_opt[np.argmax(opt_gold)])"), ("0.3", "float(betas[np.argmax(opt_gold)])"),
                                 ("-1.61", "float(opt_gold[-1])"), ("3.8", "float(d_opt[-1])"), ("0.02", "float(betas[-1])"))),
    Quote(A3_03, "seq_analysis_a1", "the proxy rises monotonically (from 0 to 2.40)", "gold_decomposition",
          (("0", "reference['proxy']"), ("2.40", "float(opt_proxy[-1])"))),
    Quote(A3_03, "seq_analysis_a1", "curve, puts its peak at d = 1.18, close to the observed 1.25", "experiment_overopt",
          (("1.18", "float(np.exp(alpha_rl / b_rl - 1))"), ("1.25", "float(d_opt[np.argmax(opt_gold)])"))),
    Quote(A3_03, "seq_analysis_a1", "(there it puts the peak at 1.61 against an observed 1.58), and fitted to pi*_beta it would say 1.64",
          "experiment_overopt", (("1.61", "float(alpha / (2 * b))"), ("1.58", "float(np.sqrt(bon_kl)[np.argmax(bon_gold)])"),
                                 ("1.64", "float(alpha_q / (2 * b_q))"))),
    Quote(A3_03, "seq_analysis_a1", "Up to the peak the gold reward gains 1.30, of which 0.57 is the missing-EOS term",
          "gold_decomposition", (("1.30", lambda ns: _gold_change(ns, "gold", 0, _peak(ns) + 1)),
                                 ("0.57", lambda ns: _gold_change(ns, "missing_eos", 0, _peak(ns) + 1)))),
    Quote(A3_03, "seq_analysis_a1", "0.35 the length term, 0.25 the bigram and 0.12 the target.", "gold_decomposition",
          (("0.35", lambda ns: _gold_change(ns, "length", 0, _peak(ns) + 1)),
           ("0.25", lambda ns: _gold_change(ns, "bigram", 0, _peak(ns) + 1)),
           ("0.12", lambda ns: _gold_change(ns, "target", 0, _peak(ns) + 1)))),
    Quote(A3_03, "seq_analysis_a1", "the bigram term keeps improving (from -0.09 to 0)", "gold_decomposition",
          (("-0.09", lambda ns: _gold_term(ns, _peak(ns) + 1, "bigram")),
           ("0", lambda ns: _gold_term(ns, len(ns["policies"]) - 1, "bigram")))),
    Quote(A3_03, "seq_analysis_a1", "the target term falls by 1.55", "gold_decomposition",
          (("1.55", lambda ns: -_gold_change(ns, "target", _peak(ns) + 1, len(ns["policies"]) - 1)),)),
    Quote(A3_03, "seq_analysis_a1", "and the length term by 0.32", "gold_decomposition",
          (("0.32", lambda ns: -_gold_change(ns, "length", _peak(ns) + 1, len(ns["policies"]) - 1)),)),
    Quote(A3_03, "seq_analysis_a1", "the truncated share falls from 0.58 to 0.001", "gold_decomposition",
          (("0.58", lambda ns: _truncated_share(ns, 0)), ("0.001", lambda ns: _truncated_share(ns, _peak(ns) + 1)))),
    Quote(A3_03, "seq_analysis_a1", "(about 4 copies of the target instead of 1.5,", "gold_decomposition",
          (("4", lambda ns: _target_copies(ns, len(ns["policies"]) - 1)),
           ("1.5", lambda ns: _target_copies(ns, _peak(ns) + 1)))),
    Quote(A3_03, "seq_analysis_a1", "(responses grow to 5 content tokens", "gold_decomposition",
          (("5", lambda ns: _policy_mean(ns, len(ns["policies"]) - 1, ns["tree"].length)),)),
    Quote(A3_03, "seq_analysis_a1", "(d about 1.25) or from the RL form's fit (about 1.2); calling the best-of-n form's 1.64",
          "experiment_overopt", (("1.25", "float(d_opt[np.argmax(opt_gold)])"), ("1.2", "float(np.exp(alpha_rl / b_rl - 1))"),
                                 ("1.64", "float(alpha_q / (2 * b_q))"))),
    # ---- a3, notebook 3: DPO, GRPO, RLOO
    Quote(A3_03, "dpo_reading", "its gold reward peaks near step 200", "contrast_runs",
          (("200", lambda ns: _near(200, np.asarray(ns["dpo"].eval_step)[np.argmax(ns["dpo"].gold)], 50)),)),
    Quote(A3_03, "rloo_predict", "$\\pi^*_{0.05}$ (KL 10.2 nats)", "rloo_runs", (("10.2", "star['kl']"),)),
    Quote(A3_03, "dpo_reading", "policy keeps the target term at 0.65 and the length term at -0.44,", "dpo_gold_terms",
          (("0.65", lambda ns: _dpo_term(ns, "target", "dpo")), ("-0.44", lambda ns: _dpo_term(ns, "length", "dpo")))),
    Quote(A3_03, "dpo_reading", "values -0.51 and -0.63; the bigram term is 0 for both", "dpo_gold_terms",
          (("-0.51", lambda ns: _dpo_term(ns, "target", "optimum")), ("-0.63", lambda ns: _dpo_term(ns, "length", "optimum")),
           ("0", lambda ns: _dpo_term(ns, "bigram", "dpo")), ("0", lambda ns: _dpo_term(ns, "bigram", "optimum")))),
    Quote(A3_03, "dpo_reading", "(from 0.595 at 3.68 nats to 0.210 at 9.49 nats after 1,000 steps)", "contrast_runs",
          (("0.595", "float(dpo.gold[at_200])"), ("3.68", "float(dpo.kl[at_200])"),
           ("0.210", "float(dpo.gold[-1])"), ("9.49", "float(dpo.kl[-1])"))),
    Quote(A3_03, "grpo_question", "0.110 against 0.0044: 25 times", "rloo_runs",
          (("0.110", "float(same_budget['GRPO'].regret[-1])"), ("0.0044", "float(same_budget['PPO'].regret[-1])"),
           ("25", "float(same_budget['GRPO'].regret[-1] / same_budget['PPO'].regret[-1])"))),
    Quote(A3_03, "rloo_reveal", "KL is 10.44 nats against the optimum's 10.16 and its regret 0.0072, where GRPO is at 13.23 nats",
          "rloo_runs", (("10.44", "float(same_budget['RLOO'].kl[-1])"), ("10.16", "star['kl']"),
                        ("0.0072", "float(same_budget['RLOO'].regret[-1])"), ("13.23", "float(same_budget['GRPO'].kl[-1])"))),
    Quote(A3_03, "rloo_reveal", "with a regret of 0.110 and PPO at 10.23 nats with 0.0044.", "rloo_runs",
          (("0.110", "float(same_budget['GRPO'].regret[-1])"), ("10.23", "float(same_budget['PPO'].kl[-1])"),
           ("0.0044", "float(same_budget['PPO'].regret[-1])"))),
    Quote(A3_03, "rloo_reveal", "RLOO is still short of the optimum (KL 8.52 nats, regret 0.086)", "rloo_runs",
          (("8.52", lambda ns: _at_iteration(ns["same_budget"]["RLOO"], 60, "kl")),
           ("0.086", lambda ns: _at_iteration(ns["same_budget"]["RLOO"], 60, "regret")))),
    # ---- a3, notebook 3: the reward model that pays for length
    Quote(A3_03, "length_reveal", "5.16 content tokens long, against 3.25 for the unbiased one, and its gold falls from 0.073 to -0.518:",
          "experiment_length", (("5.16", "length_rows['proxy + 1 per token'][2]['length']"),
                                ("3.25", "length_rows['proxy'][2]['length']"),
                                ("0.073", "length_rows['proxy'][2]['gold']"),
                                ("-0.518", "length_rows['proxy + 1 per token'][2]['gold']"))),
    Quote(A3_03, "length_reveal", "at beta 2 (KL 0.13 nats) the biased optimum is still longer than the reference (5.10 tokens) and 1.26 tokens",
          "experiment_length", (("2", "float(length_betas[0])"), ("0.13", "length_rows['proxy + 1 per token'][0]['kl']"),
                                ("5.10", "length_rows['proxy + 1 per token'][0]['length']"),
                                ("1.26", "length_rows['proxy + 1 per token'][0]['length'] - length_rows['proxy'][0]['length']"))),
    Quote(A3_03, "length_reveal", "with gold -1.100 against -0.584.", "experiment_length",
          (("-1.100", "length_rows['proxy + 1 per token'][0]['gold']"), ("-0.584", "length_rows['proxy'][0]['gold']"))),
    Quote(A3_03, "length_reveal", "the score falls by 0.56 per content token (the gold by 0.39).", "experiment_length",
          (("0.56", lambda ns: -_reference_slope(ns, ns["task"].arrays.score)),
           ("0.39", lambda ns: -_reference_slope(ns, ns["task"].arrays.gold)))),
    Quote(A3_03, "length_reveal", "At beta 0.5 its optimum's gold is -0.217: better than the biased proxy's -0.518, worse than the unbiased proxy's 0.073.",
          "experiment_length", (("0.5", "float(length_betas[2])"), ("-0.217", "length_rows['length-normalised'][2]['gold']"),
                                ("-0.518", "length_rows['proxy + 1 per token'][2]['gold']"),
                                ("0.073", "length_rows['proxy'][2]['gold']"))),
    Quote(A3_03, "length_reveal", "worse than leaving the bias alone (-0.217 against -0.028)", "experiment_length",
          (("-0.217", lambda ns: _normalised_gold_with_bonus(ns, 0.25, 0.5)),
           ("-0.028", lambda ns: _optimum_gold(ns, ns["sq"].length_bias.with_length_bonus(ns["task"], 0.25).arrays.score, 0.5)))),
    Quote(A3_03, "length_predict", "(the reference's mean is 4.64 content tokens)", "experiment_length",
          (("4.64", "sq.length_bias.length_summary(task, task.arrays.ref_resp_logp)['length']"),)),
    Quote(A3_03, "length_ppo_reveal", "its responses grow from 3.90 to 5.00 content tokens and its gold falls from 0.087 to -0.195;",
          "length_ppo_runs", (("3.90", None), ("5.00", None), ("0.087", None), ("-0.195", None))),
    Quote(A3_03, "length_ppo_reveal", "it ends at 4.96 tokens and gold -0.202.", "length_ppo_runs",
          (("4.96", None), ("-0.202", None))),
    Quote(A3_03, "length_ppo_reveal", "At beta 0.2 the two are within 0.03 of each other", "experiment_length",
          (("0.03", lambda ns: _at_most(0.03, abs(ns["length_rows"]["proxy + 1 per token"][3]["gold"]
                                                  - ns["length_rows"]["length-normalised"][3]["gold"]))),)),
    Quote(A3_03, "length_ppo_reveal", "as their exact optima are (-0.170 and -0.142 in the table)", "experiment_length",
          (("-0.170", "length_rows['proxy + 1 per token'][3]['gold']"),
           ("-0.142", "length_rows['length-normalised'][3]['gold']"))),
)


# ------------------------------------------------------------------------------------------------
# reading the notebooks


def _read(notebook):
    import jupytext

    return jupytext.read(CONTENT / f"{notebook}.py")


def _gid(cell):
    return (cell.metadata.get("nbgrader") or {}).get("grade_id")


def _flat(text: str) -> str:
    """Prose with its line breaks and runs of spaces folded to single spaces."""
    return " ".join(text.split())


def _as_float(quoted: str) -> float:
    return float(quoted.replace("−", "-").replace(",", ""))


def _decimals(quoted: str) -> int:
    return len(quoted.split(".", 1)[1]) if "." in quoted else 0


def agrees(quoted: str, value: float) -> bool:
    """Does ``value`` round to ``quoted`` (to the quote's decimals; half a unit either side, and a hair more)?"""
    tolerance = 0.5 * 10.0 ** -_decimals(quoted)
    return math.isfinite(value) and abs(value - _as_float(quoted)) <= tolerance * (1 + 1e-6) + 1e-12


def printed(quoted: str, output: str) -> bool:
    """Is ``quoted`` a whole number in ``output`` (not a part of a longer one)?"""
    number = re.escape(quoted.replace("−", "-")).replace(r"\-", "-")
    return re.search(rf"(?<![\d.]){number}(?![\d])", output.replace("−", "-")) is not None


_CELLS = {}


_UNNAMED = {}


def _prose(notebook, gid):
    if notebook not in _CELLS:
        cells = _read(notebook).cells
        _CELLS[notebook] = {_gid(c): c for c in cells if _gid(c)}
        _UNNAMED[notebook] = [c for c in cells if c.cell_type == "markdown" and not _gid(c)]
    return _CELLS[notebook].get(gid)


def _prose_of(quote):
    """The markdown cell of ``quote``: by grade_id, or (``prose`` None: a Predict cell) the one unnamed cell holding it."""
    if quote.prose is not None:
        return _prose(quote.notebook, quote.prose)
    _prose(quote.notebook, None)
    holding = [c for c in _UNNAMED[quote.notebook] if _flat(quote.snippet) in _flat(c.source)]
    assert len(holding) <= 1, f"{quote.notebook}: {len(holding)} unnamed markdown cells hold {quote.snippet!r}"
    return holding[0] if holding else None


@pytest.mark.parametrize("quote", QUOTES, ids=lambda q: f"{q.notebook.split('/')[1]}:{q.prose}:{q.snippet[:30]}")
def test_every_quote_is_in_its_prose_and_names_a_code_cell(quote):
    cell = _prose_of(quote)
    assert cell is not None and cell.cell_type == "markdown", (
        f"{quote.notebook}: no markdown cell {quote.prose!r} holding {quote.snippet!r}")
    assert _flat(quote.snippet) in _flat(cell.source), (
        f"{quote.notebook}:{quote.prose}: the prose no longer says {quote.snippet!r}; update QUOTES with the prose")
    source = _prose(quote.runs_in, quote.cell)
    assert source is not None and source.cell_type == "code", f"{quote.runs_in}: no code cell {quote.cell!r}"
    for quoted, _ in quote.numbers:
        assert printed(quoted, quote.snippet), f"{quoted!r} is not a number of the snippet {quote.snippet!r}"


def test_agrees_to_the_precision_of_the_quote():
    assert agrees("0.073", 0.0731) and agrees("0.073", 0.07349) and not agrees("0.073", 0.0736)
    assert agrees("−0.98276", -0.982759) and agrees("25", 25.04) and not agrees("0.19", 0.1951)
    assert not agrees("1.0", float("nan"))
    assert printed("0.087", "proxy   3.90   0.087   2.55") and not printed("0.08", "0.087")
    assert printed("-0.195", "x  -0.195  4.22") and not printed("0.195", "-0.1955")


# ------------------------------------------------------------------------------------------------
# running the notebooks (slow)


def run_notebook(notebook, checks):
    """Run the notebook's code cells in order in one namespace; after each cell call ``checks(gid, ns, stdout)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = {"__name__": "__quoted_numbers__"}
    for cell in _read(notebook).cells:
        meta = cell.metadata.get("nbgrader") or {}
        gid = meta.get("grade_id")
        if (cell.cell_type != "code" or meta.get("grade") or gid in SKIP_CELLS
                or "grading.start()" in cell.source):
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(cell.source, f"<{notebook}:{gid}>", "exec"), ns)
        plt.close("all")
        checks(gid, ns, out.getvalue())
    return ns


def stale_quotes(notebook, quotes=QUOTES, run=run_notebook):
    """``[message]`` for every quoted number of ``notebook`` that is not what its cell gives now."""
    mine = [q for q in quotes if q.runs_in == notebook]
    found, seen = [], set()

    def checks(gid, ns, stdout):
        for q in mine:
            if q.cell != gid:
                continue
            seen.add(id(q))
            for quoted, how in q.numbers:
                where = f"{q.notebook}:{q.prose}: {quoted!r} in {q.snippet!r}"
                if how is None:
                    if not printed(quoted, stdout):
                        found.append(f"{where}: cell {gid} does not print it; it prints\n{stdout}")
                    continue
                value = how(ns) if callable(how) else eval(how, ns)
                value = float(np.asarray(value, np.float64))
                if not agrees(quoted, value):
                    found.append(f"{where}: cell {gid} now gives {value!r}")

    run(notebook, checks)
    found += [f"{notebook}: cell {q.cell} never ran" for q in mine if id(q) not in seen]
    return found


@pytest.mark.slow
@pytest.mark.parametrize("notebook", sorted({q.runs_in for q in QUOTES}))
def test_quoted_numbers_are_what_the_cells_give(notebook, tmp_path, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)   # the cells skipped while autograding run here
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(tmp_path)
    stale = stale_quotes(notebook)
    assert not stale, "prose quotes numbers its cells no longer give:\n" + "\n".join(stale)


def test_a_stale_quote_is_reported():
    """The checker: a quote the cell no longer gives, one it does not print, and a cell that never ran fail."""
    fake = [Quote("x", "p", "gives 0.50 and 0.25", "c1", (("0.50", "half"), ("0.25", None))),
            Quote("x", "p", "gives 0.75 and 0.3", "c1", (("0.75", "half"), ("0.3", lambda ns: ns["half"] - 0.2))),
            Quote("x", "p", "gives 1", "c2", (("1", "1"),))]

    def run(notebook, checks):
        checks("c1", {"half": 0.5}, "prints 0.250\n")

    stale = stale_quotes("x", fake, run=run)
    assert len(stale) == 3, stale
    assert "'0.25'" in stale[0] and "does not print it" in stale[0]
    assert "'0.75'" in stale[1] and "now gives 0.5" in stale[1]
    assert "cell c2 never ran" in stale[2]
