"""The lesson's 3-panel figure and a data-and-provenance export.

Panels (each quantity keeps its own axis and unit; nothing is added across panels):

(a) exact expected learned reward ``E_pi[r]`` after each rollout batch, in reward-model score units;
(b) exact ``KL(pi || pi_ref)`` after each rollout batch, in nats;
(c) reference vs final action probabilities (grouped bars), with the analytic optimum
    ``pi* ∝ pi_ref exp(r / beta)`` marked.

Index 0 on the x axis of (a) and (b) is the reference policy before any rollout; index ``k`` is the
policy after ``k`` rollout batches (so index ``k`` shows ``result.reward[k - 1]``).

Backend policy: importing this module never selects a matplotlib backend. When no figure is passed
in and ``matplotlib.pyplot`` has not been imported (a headless script), the figure is a plain
:class:`~matplotlib.figure.Figure` with an Agg canvas, so nothing global changes. When pyplot is
already in use (a notebook with ``%matplotlib inline`` or ``%matplotlib widget``), the figure is
created through pyplot so it shows up with the notebook's own backend.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import importlib.metadata
import io
import json
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import checks

REWARD_LABEL = "expected learned reward (reward-model score units)"
KL_LABEL = "KL(π ‖ π_ref) (nats)"
PROB_LABEL = "probability"
ROLLOUT_LABEL = "rollout batch index (0 = reference, before training)"

_REF_COLOUR = "#7f7f7f"
_FINAL_COLOUR = "#1f77b4"
_OPT_COLOUR = "#d62728"
_BAR_WIDTH = 0.38


@dataclass
class PanelArtists:
    """Handles to every artist :func:`update_three_panel` changes (stored as ``fig.rlhf_panels``)."""

    ax_reward: Any
    ax_kl: Any
    ax_probs: Any
    reward_line: Any  # Line2D: E_pi[r] at rollout indices 0..T
    reward_ref_line: Any  # horizontal line: E_{pi_ref}[r]
    reward_opt_line: Any  # horizontal line: E_{pi*}[r]
    kl_line: Any  # Line2D: KL at rollout indices 0..T
    kl_opt_line: Any  # horizontal line: KL(pi* || pi_ref)
    ref_bars: Any  # BarContainer, reference probabilities
    final_bars: Any  # BarContainer, final probabilities
    opt_markers: Any  # Line2D markers at the optimum probabilities
    title: Any  # the figure suptitle Text (beta and final numbers)
    n_actions: int


# ----------------------------------------------------------------------------------------------
# Data preparation (pure, numpy float64)


def _as_series(result) -> dict:
    """Pull one run's arrays out of a :class:`~rlhf_lab.trainer.TrainResult` as float64 numpy."""
    reward = np.asarray(result.reward, dtype=np.float64)
    kl = np.asarray(result.kl, dtype=np.float64)
    probs = np.asarray(result.probs, dtype=np.float64)
    if reward.ndim != 1 or kl.shape != reward.shape or probs.ndim != 2 or probs.shape[0] != reward.shape[0]:
        raise ValueError(
            "result must hold ONE run (reward[T], kl[T], probs[T, n]); got shapes "
            f"reward{reward.shape}, kl{kl.shape}, probs{probs.shape} (index a sweep result first)"
        )
    ref_logp = np.asarray(result.ref_logp, dtype=np.float64)
    if ref_logp.shape != (probs.shape[1],):
        raise ValueError(f"result.ref_logp has shape {ref_logp.shape}, expected ({probs.shape[1]},)")
    return {
        "reward": reward,
        "kl": kl,
        "probs": probs,
        "clip_frac": np.asarray(result.clip_frac, dtype=np.float64),
        "ref_logp": ref_logp,
        "initial_reward": float(np.asarray(result.initial_reward)),
    }


def optimum_probabilities(ref_logp, rewards, beta) -> np.ndarray:
    """``pi*(a) = pi_ref(a) exp(r(a)/beta) / Z`` in float64, computed in log space (no overflow)."""
    beta = checks.beta(beta)
    z = np.asarray(ref_logp, np.float64) + np.asarray(rewards, np.float64) / beta
    z = z - z.max()
    return np.exp(z - np.log(np.sum(np.exp(z))))


def _panel_data(result, rewards, beta, optimum_probs) -> dict:
    s = _as_series(result)
    n = s["probs"].shape[1]
    rewards = checks.finite_vector("rewards", rewards, size=n)
    beta = checks.beta(beta)
    if optimum_probs is None:
        opt = optimum_probabilities(s["ref_logp"], rewards, beta)
    else:
        opt = checks.finite_vector("optimum_probs", optimum_probs, size=n)
        if np.any(opt < 0) or abs(opt.sum() - 1.0) > 1e-4:
            raise ValueError(f"optimum_probs must be a probability vector (>= 0, sums to 1), got {opt}")
    ref_p = np.exp(s["ref_logp"])
    positive = opt > 0
    opt_kl = float(np.sum(opt[positive] * (np.log(opt[positive]) - s["ref_logp"][positive])))
    return {
        "x": np.arange(s["reward"].shape[0] + 1),
        "reward": np.concatenate([[s["initial_reward"]], s["reward"]]),
        "kl": np.concatenate([[0.0], s["kl"]]),
        "ref_probs": ref_p,
        "final_probs": s["probs"][-1],
        "opt_probs": opt,
        "initial_reward": s["initial_reward"],
        "opt_reward": float(np.sum(opt * rewards)),
        "opt_kl": opt_kl,
        "beta": beta,
        "n": n,
    }


# ----------------------------------------------------------------------------------------------
# Figure


def _new_figure(figsize):
    """A figure that does not change global matplotlib state (see the module docstring)."""
    if "matplotlib.pyplot" in sys.modules:
        import matplotlib.pyplot as plt

        return plt.figure(figsize=figsize, layout="constrained")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _draw_bars(ax, d):
    x = np.arange(d["n"])
    ref_bars = ax.bar(x - _BAR_WIDTH / 2, d["ref_probs"], _BAR_WIDTH, color=_REF_COLOUR, label="reference π_ref")
    final_bars = ax.bar(x + _BAR_WIDTH / 2, d["final_probs"], _BAR_WIDTH, color=_FINAL_COLOUR, label="final π")
    (opt_markers,) = ax.plot(
        x + _BAR_WIDTH / 2, d["opt_probs"], linestyle="none", marker="D", markersize=7,
        markerfacecolor="white", markeredgecolor=_OPT_COLOUR, markeredgewidth=2,
        label="analytic optimum π*",
    )
    ax.set_xticks(x, [f"action {i}" for i in x])
    ax.set_ylim(0.0, 1.05)
    ax.set_xlabel("action")
    ax.set_ylabel(PROB_LABEL)
    ax.set_title("(c) Action probabilities")
    ax.legend(loc="upper right", fontsize="small")
    return ref_bars, final_bars, opt_markers


def _suptitle(d) -> str:
    return (
        f"β = {d['beta']:.4g}: final E[r] = {d['reward'][-1]:.4f} (score units), "
        f"final KL = {d['kl'][-1]:.4f} nats"
    )


def three_panel_figure(result, rewards, beta, optimum_probs=None, fig=None):
    """Draw the lesson's 3-panel figure for one run.

    Args:
      result: a single-run :class:`~rlhf_lab.trainer.TrainResult` (``reward[T]``, ``kl[T]``,
        ``probs[T, n]``, ``ref_logp[n]``, ``initial_reward``).
      rewards: ``[n]`` the frozen per-action rewards the run was trained on.
      beta: the KL coefficient of the run (> 0); used for the analytic optimum.
      optimum_probs: ``[n]`` optimum probabilities; computed from ``ref_logp``, ``rewards`` and
        ``beta`` when omitted.
      fig: an existing (empty) figure to draw into, e.g. one created by an ``ipympl`` widget;
        a new figure is created when omitted (see the module docstring for the backend policy).

    Returns:
      The :class:`matplotlib.figure.Figure`; its artists are in ``fig.rlhf_panels``
      (:class:`PanelArtists`) for :func:`update_three_panel`.
    """
    d = _panel_data(result, rewards, beta, optimum_probs)
    if fig is None:
        fig = _new_figure((13.0, 4.0))
    else:
        fig.clear()
    ax_r, ax_k, ax_p = fig.subplots(1, 3)

    (reward_line,) = ax_r.plot(d["x"], d["reward"], marker="o", markersize=3, color=_FINAL_COLOUR, label="policy π")
    reward_ref_line = ax_r.axhline(d["initial_reward"], color=_REF_COLOUR, linestyle=":", label="reference π_ref")
    reward_opt_line = ax_r.axhline(d["opt_reward"], color=_OPT_COLOUR, linestyle="--", label="analytic optimum π*")
    ax_r.set_xlabel(ROLLOUT_LABEL)
    ax_r.set_ylabel(REWARD_LABEL)
    ax_r.set_title("(a) Exact expected learned reward")
    ax_r.legend(loc="lower right", fontsize="small")

    (kl_line,) = ax_k.plot(d["x"], d["kl"], marker="o", markersize=3, color=_FINAL_COLOUR, label="policy π")
    kl_opt_line = ax_k.axhline(d["opt_kl"], color=_OPT_COLOUR, linestyle="--", label="analytic optimum π*")
    ax_k.set_xlabel(ROLLOUT_LABEL)
    ax_k.set_ylabel(KL_LABEL)
    ax_k.set_title("(b) Exact KL to the fixed reference")
    ax_k.set_ylim(bottom=0.0)
    ax_k.legend(loc="lower right", fontsize="small")

    ref_bars, final_bars, opt_markers = _draw_bars(ax_p, d)
    title = fig.suptitle(_suptitle(d), fontsize="medium")
    fig.rlhf_panels = PanelArtists(
        ax_reward=ax_r, ax_kl=ax_k, ax_probs=ax_p,
        reward_line=reward_line, reward_ref_line=reward_ref_line, reward_opt_line=reward_opt_line,
        kl_line=kl_line, kl_opt_line=kl_opt_line,
        ref_bars=ref_bars, final_bars=final_bars, opt_markers=opt_markers, title=title, n_actions=d["n"],
    )
    return fig


def update_three_panel(fig, result, rewards, beta, optimum_probs=None, *, redraw=True):
    """Update a figure made by :func:`three_panel_figure` in place with a new run.

    Same arguments as :func:`three_panel_figure`. Lines get ``set_data``, bars ``set_height`` and
    the optimum markers ``set_ydata``; no figure, axes or line is created, so a live widget canvas
    does not flicker. A different number of rollouts is fine (axes are rescaled). A different
    number of actions redraws panel (c) inside the same axes.

    Args:
      fig: a figure returned by :func:`three_panel_figure`.
      result, rewards, beta, optimum_probs: as in :func:`three_panel_figure`.
      redraw: call ``fig.canvas.draw_idle()`` at the end (set False to batch several updates).

    Returns:
      The same ``fig``.
    """
    art = getattr(fig, "rlhf_panels", None)
    if not isinstance(art, PanelArtists):
        raise ValueError("fig must be a figure created by three_panel_figure (it has no rlhf_panels)")
    d = _panel_data(result, rewards, beta, optimum_probs)

    art.reward_line.set_data(d["x"], d["reward"])
    art.reward_ref_line.set_ydata([d["initial_reward"]] * 2)
    art.reward_opt_line.set_ydata([d["opt_reward"]] * 2)
    art.kl_line.set_data(d["x"], d["kl"])
    art.kl_opt_line.set_ydata([d["opt_kl"]] * 2)
    for ax in (art.ax_reward, art.ax_kl):
        ax.relim()
        ax.autoscale_view()
    art.ax_kl.set_ylim(bottom=0.0)

    if d["n"] == art.n_actions:
        for bar, h in zip(art.ref_bars, d["ref_probs"]):
            bar.set_height(h)
        for bar, h in zip(art.final_bars, d["final_probs"]):
            bar.set_height(h)
        art.opt_markers.set_ydata(d["opt_probs"])
    else:
        art.ax_probs.cla()
        art.ref_bars, art.final_bars, art.opt_markers = _draw_bars(art.ax_probs, d)
        art.n_actions = d["n"]

    art.title.set_text(_suptitle(d))
    if redraw and fig.canvas is not None:
        fig.canvas.draw_idle()
    return fig


# ----------------------------------------------------------------------------------------------
# Export


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def provenance() -> dict:
    """Where and with what a run was made: UTC time, Python, platform, package versions, JAX backend."""
    import jax

    from . import __version__

    return {
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "packages": {
            "jax": _version("jax"),
            "jaxlib": _version("jaxlib"),
            "numpy": _version("numpy"),
            "matplotlib": _version("matplotlib"),
            "rlhf_lab": _version("rlhf-lab") or __version__,
        },
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(dev) for dev in jax.devices()],
        "dtype": "float32",
    }


def _floats(x) -> Any:
    """Nested lists of plain Python floats (strict JSON: a non-finite value is an error)."""
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"cannot export non-finite values: {arr}")
    return arr.tolist()


def run_record(config, result, summary, rewards=None) -> dict:
    """The export payload as a JSON-ready dict (see :func:`export_run`)."""
    s = _as_series(result)
    n_rollouts = s["reward"].shape[0]
    if dataclasses.is_dataclass(config):
        cfg = dataclasses.asdict(config)
    elif isinstance(config, dict):
        cfg = dict(config)
    else:
        raise ValueError(f"config must be a PPOConfig (dataclass) or a dict, got {type(config).__name__}")
    cfg = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()}
    if not isinstance(summary, dict):
        raise ValueError(f"summary must be a dict of numbers, got {type(summary).__name__}")
    headline = {k: float(v) for k, v in summary.items() if isinstance(v, (int, float, np.floating)) and not isinstance(v, bool)}
    record = {
        "provenance": provenance(),
        "config": cfg,
        "units": {
            "expected_reward": "reward-model score units",
            "kl": "nats",
            "probs": "probability",
            "clip_fraction": "fraction of samples in the rollout batch",
        },
        "series": {
            "rollout": list(range(1, n_rollouts + 1)),
            "expected_reward": _floats(s["reward"]),
            "kl": _floats(s["kl"]),
            "clip_fraction": _floats(s["clip_frac"]),
            "probs": _floats(s["probs"]),
        },
        "reference_probs": _floats(np.exp(s["ref_logp"])),
        "final_probs": _floats(s["probs"][-1]),
        "summary": headline,
    }
    if "optimum_probs" in summary:
        record["optimum_probs"] = _floats(summary["optimum_probs"])
    elif rewards is not None and "beta" in cfg:
        record["optimum_probs"] = _floats(optimum_probabilities(s["ref_logp"], rewards, cfg["beta"]))
    if rewards is not None:
        record["rewards"] = _floats(rewards)
    return record


def _csv_text(record: dict) -> str:
    buf = io.StringIO()
    buf.write("# rlhf_lab run export: per-rollout series (index k = policy after k rollout batches)\n")
    prov = record["provenance"]
    buf.write(f"# created_utc: {prov['created_utc']}\n")
    buf.write(f"# python: {prov['python']}; platform: {prov['platform']}; jax_backend: {prov['jax_backend']}\n")
    buf.write("# packages: " + ", ".join(f"{k}=={v}" for k, v in prov["packages"].items()) + "\n")
    buf.write("# config: " + json.dumps(record["config"], sort_keys=True) + "\n")
    buf.write("# summary: " + json.dumps(record["summary"], sort_keys=True) + "\n")
    for key in ("reference_probs", "final_probs", "optimum_probs", "rewards"):
        if key in record:
            buf.write(f"# {key}: " + json.dumps(record[key]) + "\n")
    buf.write("# units: " + json.dumps(record["units"], sort_keys=True) + "\n")
    series = record["series"]
    n = len(series["probs"][0])
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["rollout", "expected_reward", "kl_nats", "clip_fraction"] + [f"prob_action_{i}" for i in range(n)])
    for i, k in enumerate(series["rollout"]):
        row = [k, series["expected_reward"][i], series["kl"][i], series["clip_fraction"][i]] + list(series["probs"][i])
        writer.writerow([repr(v) if isinstance(v, float) else v for v in row])
    return buf.getvalue()


def export_run(path, config, result, summary, rewards=None) -> dict:
    """Write one run's data and provenance to ``path``.

    ``*.json``: the full record (provenance with UTC timestamp, Python, platform and the versions of
    jax/jaxlib/numpy/matplotlib/rlhf_lab; the config including the seed; the per-rollout series of
    exact reward, exact KL, clip fraction and probabilities; reference/final/optimum probabilities;
    the summary numbers). ``*.csv``: the per-rollout series as columns, preceded by ``#`` comment
    lines carrying the same provenance, config and summary.

    Args:
      path: destination ending in ``.json`` or ``.csv``.
      config: the run's :class:`~rlhf_lab.trainer.PPOConfig` (or a dict).
      result: the single-run :class:`~rlhf_lab.trainer.TrainResult`.
      summary: a dict of headline numbers, e.g. from :func:`rlhf_lab.lesson.summarise`
        (its ``optimum_probs`` is exported when present).
      rewards: optional ``[n]`` rewards; exported, and used for the optimum when the summary has none.

    Returns:
      The record that was written (as a dict).
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".json", ".csv"):
        raise ValueError(f"path must end with .json or .csv, got {path!r}")
    record = run_record(config, result, summary, rewards)
    if ext == ".json":
        text = json.dumps(record, indent=2, allow_nan=False) + "\n"
    else:
        text = _csv_text(record)
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    return record


__all__ = [
    "PanelArtists", "three_panel_figure", "update_three_panel", "optimum_probabilities",
    "provenance", "run_record", "export_run", "REWARD_LABEL", "KL_LABEL", "PROB_LABEL", "ROLLOUT_LABEL",
]

