"""Live PPO explorer: ipywidgets sliders that re-run the compiled trainer as beta and epsilon move.

How to call it (the standalone ``source/a2c_ppo_explorer`` notebook and the make-it-yours notebook of
``source/a2_ppo_rlhf`` both use exactly this)::

    from rlhf_lab.explorer import PPOExplorer
    explorer = PPOExplorer()
    explorer.show()

``PPOExplorer().show()`` or ``rlhf_lab.explorer.explore()`` do the same in one line (without keeping
a name for the object). ``explorer.last_summary`` holds the numbers of the run on screen.

What it shows
-------------
* Sliders for beta (KL coefficient), epsilon (clip range), learning rate, inner epochs, batch size,
  number of rollouts and seed. Each slider has its own text box for typing an exact value.
* A three-panel figure (expected reward per rollout; KL to the reference in nats; reference, final
  and analytic-optimum action probabilities), drawn once and then updated in place.
* A readout line: final expected reward, final KL, the regularised objective ``E[r] - beta KL`` next
  to the analytic optimum and the gap, and the fraction of samples clipped in the last batch.
* A beta x epsilon map: heatmaps of final reward and final KL from ONE vmapped
  :func:`rlhf_lab.sweep.sweep_grid` call, with the current slider point marked.

Design notes
------------
*No recompilation for beta/epsilon/lr/seed.* Every run calls the program cached by
:func:`rlhf_lab.trainer.make_train` ``(iterations, batch_size, epochs)`` exactly as
:func:`rlhf_lab.trainer.train` does (same key, same float32 traced scalars; the numbers are
identical); beta, epsilon and the learning rate are traced arguments and the seed only changes the
PRNG key *value*. The headline numbers come from a small jitted function of the run's outputs with
a traced beta. Only a new shape (rollouts, batch size, epochs) traces and compiles, once per shape,
and is cached afterwards. ``rlhf_lab.trainer.TRACE_COUNTS`` counts every trace (keys ``train``,
``sweep`` and ``explorer_summary``), so tests can prove that moving beta or epsilon does not
recompile.

*The map is recomputed only when it can change*: its cells depend on the shape, the seed and the
learning rate, not on the sliders' beta/epsilon, so moving beta/epsilon only moves the ring. The
first map needs its own (larger) compile, so inside a kernel it is computed just after the
explorer is first shown.

*Coalescing ("latest wins").* A slider change does not compute anything itself: it records the new
value and, if no update is pending yet, schedules ONE update on the kernel's asyncio event loop
after ``delay`` seconds (30 ms by default). When that update runs it reads the *current* values,
so a fast drag that sends twenty values while one update is pending costs one run, with the newest
value; there is never a queue of stale runs. With no running event loop (a plain script, the
tests) each change updates synchronously instead, and :meth:`PPOExplorer.set` groups several
changes into one update. The costly sliders (shape, learning rate, seed: they also recompute the
map) use ``continuous_update=False`` and send their value when released.

*Typed values are validated, not clamped, and used exactly.* An ipywidgets slider silently clamps
an out-of-range number typed into its readout, so the sliders here have no readout; each has a
text box instead. A typed value is checked with :mod:`rlhf_lab.checks` (the library's own
messages) and against the slider's range; a bad one is rejected with a red message and the box
reverts to the value in use. A good one is used as typed: the slider's front end may answer with
the nearest point of its step grid, and that echo (within half a step of the value just set) is
ignored, while a user's move (at least half a step away) is taken.

*Drawing.* Two :class:`matplotlib.figure.Figure` objects with an Agg canvas (no pyplot state, no
ipympl) are created once; updates call ``set_data``/``set_ydata``/``set_height``/``set_array`` on
their artists and render the *same* figures to PNG bytes for two ``ipywidgets.Image`` widgets.
Replacing an image's bytes swaps the picture without clearing the output area, so nothing
flickers, and it works headless and in JupyterLab 4 with only the pinned packages. The changing
artists are ``animated`` and drawn over a cached background (blitting): the axes ranges are fixed
by the rewards and the reference (``E[r]`` lies in ``[min r, max r]``, ``KL <= max -log pi_ref``),
so a beta/epsilon move redraws only the data: many times faster than a full redraw (figures
in ``bench/results/explorer.md``).
``rlhf_lab.plots`` draws the lesson's static figure; it rescales its axes and uses constrained
layout on every update, which costs a full redraw each time, so the explorer keeps its own
figure code (same colours: reference grey, PPO blue, optimum red).

*Stable DOM hooks.* Widgets carry CSS classes (``ppo-beta-slider``, ``ppo-beta-box``,
``ppo-readout``, ``ppo-error``, ``ppo-plot``, ``ppo-map``, ``ppo-map-status`` ...). The readout's
``.ppo-readout-line`` element carries ``data-*`` attributes with the parameters and numbers at full
precision plus the SHA-256 of the PNG on screen (``data-plot-sha256``); ``.ppo-map-ready`` carries
the map's SHA-256, the ring's position and the number of map computations. A browser test can read
exactly what was computed and check that the picture shown is the one that was rendered.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import html
import io
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import checks
from .ppo import categorical_kl, expected_reward, optimal_logp, regularised_objective
from .sweep import sweep_grid
from .trainer import TRACE_COUNTS, PPOConfig, lesson_rewards, make_train

__all__ = ["PPOExplorer", "ParamSpec", "PARAMS", "explore", "summary_numbers"]


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


def _grid_axes(n_beta: int, n_eps: int):
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
# Figures (self-contained: Agg canvas, no pyplot, blitted PNG rendering)
# --------------------------------------------------------------------------------------------

_COLORS = {"reference": "#7f7f7f", "final": "#1f77b4", "optimum": "#d62728"}


def _new_figure(width: float, height: float, dpi: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def _encode_png(rgba, width: int, height: int, compress_level: int = 1) -> bytes:
    """PNG bytes of an RGBA buffer (Pillow; level 1 is ~as small as the default and much faster)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.frombuffer("RGBA", (width, height), rgba, "raw", "RGBA", 0, 1).save(
        buf, format="png", compress_level=compress_level
    )
    return buf.getvalue()


class _BlitFigure:
    """A figure whose changing artists are ``animated`` and drawn over a cached background.

    ``render()`` draws the static part (axes, ticks, labels, legend, heatmaps) only when
    :meth:`invalidate` was called (new axis range, new map); otherwise it restores the cached
    background and draws just the dynamic artists. The result is the same picture a full redraw
    gives, in a fraction of the time, and always of the same :class:`~matplotlib.figure.Figure`.
    """

    def __init__(self, fig, dynamic):
        self.fig = fig
        self.dynamic = list(dynamic)
        for artist in self.dynamic:
            artist.set_animated(True)
        self._background = None
        self.full_draws = 0

    def invalidate(self) -> None:
        self._background = None

    def render(self) -> bytes:
        canvas = self.fig.canvas
        if self._background is None:
            canvas.draw()  # everything but the animated artists
            self._background = canvas.copy_from_bbox(self.fig.bbox)
            self.full_draws += 1
        else:
            canvas.restore_region(self._background)
        for artist in self.dynamic:
            self.fig.draw_artist(artist)
        width, height = canvas.get_width_height(physical=True)
        return _encode_png(canvas.buffer_rgba(), width, height)


class _ThreePanel:
    """Reward per rollout, KL per rollout (nats), action probabilities.

    Axis ranges are fixed by quantities that do not depend on the sliders, so a beta/epsilon change
    only moves data artists: ``E_pi[r]`` always lies in ``[min r, max r]`` and
    ``KL(pi || pi_ref) <= max_a -log pi_ref(a)`` (the KL of a point mass on the least likely
    reference action). Only the x range (number of rollouts) forces a full redraw.
    """

    def __init__(self, rewards: np.ndarray, ref_probs: np.ndarray, dpi: float):
        from matplotlib.legend_handler import HandlerTuple
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        n_actions = len(rewards)
        self.fig = _new_figure(12.0, 3.5, dpi)
        self.fig.subplots_adjust(left=0.06, right=0.99, bottom=0.15, top=0.80, wspace=0.28)
        ax_r, ax_kl, ax_p = self.fig.subplots(1, 3)
        self.axes = (ax_r, ax_kl, ax_p)
        x = np.arange(1, 2)
        (self.reward_line,) = ax_r.plot(x, x * 0.0, color=_COLORS["final"], lw=1.8)
        self.reward_ref = ax_r.axhline(0.0, color=_COLORS["reference"], ls="--", lw=1.2)
        self.reward_opt = ax_r.axhline(0.0, color=_COLORS["optimum"], ls=":", lw=1.6)
        lo, hi = float(np.min(rewards)), float(np.max(rewards))
        pad = 0.05 * (hi - lo if hi > lo else 1.0)
        ax_r.set_ylim(lo - pad, hi + pad)
        ax_r.set_xlabel("rollout batch (count)")
        ax_r.set_ylabel("E_π[r] (reward units)")
        ax_r.set_title("Expected learned reward", fontsize=10)
        (self.kl_line,) = ax_kl.plot(x, x * 0.0, color=_COLORS["final"], lw=1.8)
        self.kl_opt = ax_kl.axhline(0.0, color=_COLORS["optimum"], ls=":", lw=1.6)
        kl_max = float(np.max(-np.log(ref_probs)))
        ax_kl.set_ylim(-0.03 * kl_max, 1.05 * kl_max)
        ax_kl.set_xlabel("rollout batch (count)")
        ax_kl.set_ylabel("KL(π ‖ π_ref) (nats)")
        ax_kl.set_title("KL to the reference", fontsize=10)
        idx = np.arange(n_actions)
        width = 0.26
        self.bars = {}
        for k, name in enumerate(("reference", "final", "optimum")):
            self.bars[name] = list(ax_p.bar(idx + (k - 1) * width, np.zeros(n_actions), width, color=_COLORS[name]))
        ax_p.set_xticks(idx, [f"action {i}" for i in idx])
        ax_p.set_ylim(0.0, 1.0)
        ax_p.set_ylabel("probability (fraction)")
        ax_p.set_xlabel("action")
        ax_p.set_title("Action probabilities", fontsize=10)
        handles = [
            (Line2D([], [], color=_COLORS[name], ls=ls), Patch(color=_COLORS[name]))
            for name, ls in (("reference", "--"), ("final", "-"), ("optimum", ":"))
        ]
        labels = ["reference π_ref", "PPO policy π (after each rollout)", "analytic optimum π*"]
        self.fig.legend(handles, labels, loc="upper right", ncol=3, fontsize=8, frameon=False,
                        handler_map={tuple: HandlerTuple(ndivide=None, pad=0.6)}, handlelength=3.2,
                        columnspacing=1.4, bbox_to_anchor=(0.995, 1.0))
        # Only the loop settings are written on the figure (static: redrawn with the background).
        # beta and epsilon are in the boxes and the readout right above it: a changing text
        # artist would cost more than every other artist together (text layout is slow in Agg).
        self.subtitle = self.fig.text(0.01, 0.975, "", fontsize=8, ha="left", va="top", color="#444444")
        self._xmax = None
        dynamic = [self.reward_ref, self.reward_opt, self.reward_line, self.kl_opt, self.kl_line]
        for name in ("reference", "final", "optimum"):
            dynamic.extend(self.bars[name])
        self.blit = _BlitFigure(self.fig, dynamic)

    def update(self, params: dict, s: dict) -> None:
        """Move the artists to run ``s`` (a :func:`summary_numbers` dict); the figure is reused."""
        x = np.arange(1, len(s["reward"]) + 1)
        self.reward_line.set_data(x, s["reward"])
        self.reward_ref.set_ydata([s["initial_reward"]] * 2)
        self.reward_opt.set_ydata([s["optimum_reward"]] * 2)
        self.kl_line.set_data(x, s["kl"])
        self.kl_opt.set_ydata([s["optimum_kl"]] * 2)
        for name, key in (("reference", "reference_probs"), ("final", "final_probs"), ("optimum", "optimum_probs")):
            for rect, p in zip(self.bars[name], s[key]):
                rect.set_height(p)
        if self._xmax != len(x):  # new number of rollouts: new x range, new ticks
            self._xmax = len(x)
            for ax in self.axes[:2]:
                ax.set_xlim(0.5, len(x) + 0.5)
            self.blit.invalidate()
        subtitle = (f"lr {params['learning_rate']:.3g}, {params['iterations']} rollouts × {params['batch_size']} "
                    f"samples × {params['epochs']} inner epochs, seed {params['seed']}")
        if subtitle != self.subtitle.get_text():  # static part: changes only with a full redraw
            self.subtitle.set_text(subtitle)
            self.blit.invalidate()

    def render(self) -> bytes:
        return self.blit.render()


class _MapPanel:
    """Final reward and final KL over the beta x epsilon grid, with the slider point marked."""

    def __init__(self, beta_edges, eps_edges, dpi: float):
        self.fig = _new_figure(9.0, 3.3, dpi)
        self.fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.84, wspace=0.3)
        shape = (len(beta_edges) - 1, len(eps_edges) - 1)
        self.meshes, dynamic = [], []
        ax_a, ax_b = self.fig.subplots(1, 2)
        self.axes = (ax_a, ax_b)
        for ax, title, unit, cmap in (
            (ax_a, "final expected reward", "reward units", "viridis"),
            (ax_b, "final KL(π ‖ π_ref)", "nats", "magma"),
        ):
            mesh = ax.pcolormesh(eps_edges, beta_edges, np.zeros(shape), cmap=cmap, shading="flat")
            ax.set_yscale("log")
            ax.set_xlim(eps_edges[0], eps_edges[-1])
            ax.set_ylim(beta_edges[0], beta_edges[-1])
            ax.set_xlabel("ε, clip range (dimensionless)")
            ax.set_ylabel("β, KL coefficient")
            ax.set_title(title, fontsize=10)
            self.fig.colorbar(mesh, ax=ax, label=unit)
            (ring,) = ax.plot([0.2], [0.2], marker="o", ms=11, mfc="none", mec="white", mew=2.2, ls="none")
            (cross,) = ax.plot([0.2], [0.2], marker="+", ms=9, color="#ff4040", mew=1.8, ls="none")
            self.meshes.append(mesh)
            dynamic.extend([ring, cross])
        self.markers = dynamic
        self.title = self.fig.text(0.01, 0.975, "", fontsize=9, ha="left", va="top")
        self.blit = _BlitFigure(self.fig, dynamic)

    def update_grid(self, final_reward: np.ndarray, final_kl: np.ndarray, label: str) -> None:
        for mesh, values in zip(self.meshes, (final_reward, final_kl)):
            values = np.asarray(values, dtype=np.float64)
            mesh.set_array(values.ravel())
            finite = values[np.isfinite(values)]
            if finite.size:
                lo, hi = float(finite.min()), float(finite.max())
                mesh.set_clim(lo, hi if hi > lo else lo + 1e-6)
        self.title.set_text(label)
        self.blit.invalidate()

    def update_marker(self, beta: float, epsilon: float) -> None:
        for marker in self.markers:
            marker.set_data([epsilon], [beta])

    def render(self) -> bytes:
        return self.blit.render()


# --------------------------------------------------------------------------------------------
# Coalescing scheduler
# --------------------------------------------------------------------------------------------


class LatestWins:
    """At most one pending update; requests made while one is pending are absorbed into it.

    ``request()`` schedules ``callback`` after ``delay`` seconds on the running asyncio loop (the
    kernel's loop inside Jupyter) unless an update is already pending. The callback reads the
    current state when it runs, so it always computes the latest values. Without a running loop
    ``request()`` runs the callback immediately (synchronous mode, used by scripts and tests).
    """

    def __init__(self, callback: Callable[[], None], delay: float = 0.03):
        self.callback = callback
        self.delay = float(delay)
        self._handle = None
        self._held = 0
        self.requests = 0
        self.runs = 0

    @property
    def pending(self) -> bool:
        return self._handle is not None

    @contextlib.contextmanager
    def hold(self):
        """Collect the requests made inside the block into one (made when the block ends)."""
        self._held += 1
        before = self.requests
        try:
            yield
        finally:
            self._held -= 1
        if self._held == 0 and self.requests != before:
            self.requests -= 1  # the request below stands for the whole block
            self.request()

    def request(self) -> None:
        self.requests += 1
        if self._held or self._handle is not None:
            return  # an update is already scheduled (or will be) and will see the newest values
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            self._run()
        else:
            self._handle = loop.call_later(self.delay, self._run)

    def _run(self) -> None:
        self._handle = None
        self.runs += 1
        self.callback()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


# --------------------------------------------------------------------------------------------
# The explorer
# --------------------------------------------------------------------------------------------


class PPOExplorer:
    """Sliders + readout + three-panel figure + beta x epsilon map for the compiled PPO trainer.

    Args:
      config: starting values (default: the lesson's :class:`PPOConfig`).
      rewards: ``[n_actions]`` frozen rewards (default: the lesson's fitted reward model).
      grid_size: ``(n_beta, n_epsilon)`` cells of the map (one vmapped ``sweep_grid`` call).
      delay: coalescing delay in seconds (see :class:`LatestWins`).
      dpi: resolution of the rendered figures.

    Attributes:
      last_summary: numbers of the run on screen (:func:`summary_numbers` plus ``params``).
      params: the parameter values of that run (the exact values, see :meth:`current_params`).
      grid: the :class:`~rlhf_lab.sweep.GridResult` on the map (NumPy), ``grid_params`` its inputs.
      fig, map_fig: the two figures (created once, updated in place).
      stats: counters (``requests``, ``computes``, ``grid_computes``, ``renders``, ``map_renders``,
        ``rejected``, ``echoes``).
      timings: recent ``(compute_seconds, draw_seconds)`` per run update.
    """

    def __init__(self, config: PPOConfig | None = None, rewards=None, grid_size=(16, 16),
                 delay: float = 0.03, dpi: float = 72.0):
        import ipywidgets as W

        self._W = W
        config = PPOConfig() if config is None else config
        if not isinstance(config, PPOConfig):
            raise ValueError(f"config must be a PPOConfig, got {type(config).__name__}")
        self.init_logits = tuple(config.init_logits)
        self._init_logits = jnp.asarray(self.init_logits, jnp.float32)
        self._keys: dict[int, Any] = {}
        rewards = lesson_rewards() if rewards is None else rewards
        self.rewards = jnp.asarray(
            checks.finite_vector("rewards", rewards, size=len(self.init_logits)), jnp.float32
        )
        n_beta, n_eps = (int(grid_size[0]), int(grid_size[1]))
        if n_beta < 2 or n_eps < 2:
            raise ValueError(f"grid_size must be at least (2, 2), got {grid_size!r}")
        self.beta_edges, self.grid_betas, self.eps_edges, self.grid_epsilons = _grid_axes(n_beta, n_eps)
        self.stats = collections.Counter()
        self.timings: collections.deque = collections.deque(maxlen=2000)
        self.last_summary: dict | None = None
        self.last_error: Exception | None = None
        self.params: dict | None = None
        self.grid = None
        self.grid_params: dict | None = None
        self._grid_key = None
        self._png = b""
        self._map_png = b""
        self._pushing = False
        self._echo_pending: set[str] = set()
        self._scheduler = LatestWins(self._update_now, delay)

        # The exact values in use. The sliders show them, but a slider can only sit on its step
        # grid, so the front end may answer a value we set with a snapped one: see _on_slider.
        self._values = {spec.name: spec.validate(getattr(config, spec.name)) for spec in PARAMS}

        self.sliders: dict[str, Any] = {}
        self.boxes: dict[str, Any] = {}
        rows = []
        for spec in PARAMS:
            slider = self._make_slider(spec, self._values[spec.name])
            box = W.Text(value=format(self._values[spec.name], spec.fmt), continuous_update=False,
                         layout=W.Layout(width="7.5em"))
            css = spec.name.replace("_", "-")
            slider.add_class(f"ppo-{css}-slider")
            box.add_class(f"ppo-{css}-box")
            slider.observe(functools.partial(self._on_slider, spec), names="value")
            box.observe(functools.partial(self._on_box, spec), names="value")
            self.sliders[spec.name], self.boxes[spec.name] = slider, box
            rows.append(W.HBox([slider, box]))
            self._expect_echo(spec)  # a log slider sends its snapped start value when it renders

        self.error = W.HTML(value="")
        self.error.add_class("ppo-error")
        self.readout = W.HTML(value="")
        self.readout.add_class("ppo-readout")
        self.status = W.HTML(value="")
        self.status.add_class("ppo-status")
        self.map_status = W.HTML(value="")
        self.map_status.add_class("ppo-map-status")
        # Natural size (no stretching by the flex box), shrunk only if the notebook is narrower.
        self.image = W.Image(format="png", layout=W.Layout(align_self="flex-start", max_width="100%"))
        self.image.add_class("ppo-plot")
        self.map_image = W.Image(format="png", layout=W.Layout(align_self="flex-start", max_width="100%"))
        self.map_image.add_class("ppo-map")

        ref_probs = np.exp(np.asarray(jax.nn.log_softmax(jnp.asarray(self.init_logits, jnp.float32))))
        self._panels = _ThreePanel(np.asarray(self.rewards), ref_probs, dpi)
        self._map = _MapPanel(self.beta_edges, self.eps_edges, dpi)
        self.fig, self.map_fig = self._panels.fig, self._map.fig

        intro = W.HTML(
            "<b>PPO explorer</b>: β and ε re-run the compiled trainer while you drag (same compiled "
            "program: no recompilation). Learning rate, seed and the loop sizes apply when you release "
            "the slider and also refresh the β×ε map. Type an exact value in a box and press Enter."
        )
        self.widget = W.VBox(
            [intro, W.HBox([W.VBox(rows[:3]), W.VBox(rows[3:])]), self.error, self.readout, self.image,
             W.HTML("<b>β × ε map</b>: one policy trained per cell in a single vmapped call; "
                    "the ring marks the sliders."),
             self.map_status, self.map_image, self.status]
        )
        self.widget.add_class("ppo-explorer")
        # The run on screen is computed now (first compile happens here). The map needs its own,
        # larger compile: inside a kernel it is scheduled on the event loop so the explorer shows
        # up first; without a running loop it is computed right away.
        self._update_now(include_grid=False)
        self._scheduler.request()

    # ---- widgets -----------------------------------------------------------------------------

    def _make_slider(self, spec: ParamSpec, value):
        W = self._W
        common = dict(
            description=spec.label, readout=False,
            continuous_update=(spec.role == "traced"),
            style={"description_width": "9em"}, layout=W.Layout(width="24em"),
        )
        if spec.kind == "float" and spec.log:
            return W.FloatLogSlider(value=value, base=10, min=math.log10(spec.low), max=math.log10(spec.high),
                                    step=spec.step, **common)
        if spec.kind == "float":
            return W.FloatSlider(value=value, min=spec.low, max=spec.high, step=spec.step, **common)
        return W.IntSlider(value=int(value), min=int(spec.low), max=int(spec.high), step=int(spec.step), **common)

    def _slider_position(self, spec: ParamSpec, value: float) -> float:
        return math.log10(value) if spec.log else float(value)

    def _on_slider(self, spec: ParamSpec, change) -> None:
        """A slider moved (or the front end answered a value we set)."""
        if self._pushing:
            return  # our own programmatic update: _set_value does the bookkeeping
        new = change["new"]
        if spec.name in self._echo_pending:
            # The front end snaps a value it is given to the slider's step grid and sends the
            # snapped value back. That echo lies within half a step of the value in use; a user's
            # move lands at least half a step away. Ignore the echo, keep the exact value.
            self._echo_pending.discard(spec.name)
            distance = abs(self._slider_position(spec, new) - self._slider_position(spec, self._values[spec.name]))
            if distance <= 0.5 * spec.step + 1e-9:
                self.stats["echoes"] += 1
                return
        self._values[spec.name] = float(new) if spec.kind == "float" else int(new)
        self._sync_box(spec)
        self._clear_error()
        self.stats["requests"] += 1
        self._scheduler.request()

    def _on_box(self, spec: ParamSpec, change) -> None:
        """A value was typed into a box (sent on Enter or when the box loses focus)."""
        if self._pushing:
            return
        try:
            value = spec.validate(change["new"])
        except ValueError as exc:
            self.stats["rejected"] += 1
            self._show_error(str(exc))
            self._sync_box(spec)  # the box goes back to the value in use
            return
        self._clear_error()
        if value != self._values[spec.name]:
            self._set_value(spec, value)
        else:
            self._sync_box(spec)

    def _set_value(self, spec: ParamSpec, value) -> None:
        """Use ``value`` exactly, move the slider there and schedule an update."""
        self._values[spec.name] = value
        self._pushing = True
        try:
            self.sliders[spec.name].value = value
        finally:
            self._pushing = False
        self._expect_echo(spec)
        self._sync_box(spec)
        self.stats["requests"] += 1
        self._scheduler.request()

    def _expect_echo(self, spec: ParamSpec) -> None:
        # Only sliders with continuous_update=True write a snapped value back by themselves
        # (ipywidgets' "update" handler); the others send values only when the user moves them.
        if self.sliders[spec.name].continuous_update:
            self._echo_pending.add(spec.name)

    def _sync_box(self, spec: ParamSpec) -> None:
        self._pushing = True
        try:
            self.boxes[spec.name].value = format(self._values[spec.name], spec.fmt)
        finally:
            self._pushing = False

    def _show_error(self, message: str) -> None:
        self.error.value = (
            f'<div class="ppo-error-message" role="alert" style="color:#b00020;font-weight:600">'
            f"Rejected: {html.escape(message)}</div>"
        )

    def _clear_error(self) -> None:
        if self.error.value:
            self.error.value = ""

    # ---- state -------------------------------------------------------------------------------

    def current_params(self) -> dict:
        """The exact values in use (a typed value is used as typed, not snapped to the slider step)."""
        return dict(self._values)

    def config_for(self, params: dict) -> PPOConfig:
        """The validated :class:`PPOConfig` for slider values ``params``."""
        return PPOConfig(init_logits=self.init_logits, **params)

    def set(self, **values) -> None:
        """Set several values at once, validated like typed values (one coalesced update).

        Example: ``explorer.set(beta=0.5, epsilon=0.1)``. Raises ``ValueError`` for unknown names
        or invalid values (nothing is changed then).
        """
        unknown = set(values) - set(SPECS)
        if unknown:
            raise ValueError(f"unknown explorer parameter(s): {sorted(unknown)}; known: {list(SPECS)}")
        checked = {name: SPECS[name].validate(value) for name, value in values.items()}
        with self._scheduler.hold():
            for name, value in checked.items():
                if value != self._values[name]:
                    self._set_value(SPECS[name], value)

    # ---- compute -----------------------------------------------------------------------------

    def compute(self, params: dict | None = None) -> dict:
        """Run the compiled trainer for ``params`` (default: the values in use); return its numbers.

        Pure with respect to the display: no widget or figure is touched. The returned dict is
        :func:`summary_numbers` plus ``params`` and ``diverged``.
        """
        params = self.current_params() if params is None else dict(params)
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
    def _grid_key_for(params: dict):
        """What the map depends on: the shape, the seed and the learning rate (not beta/epsilon)."""
        return (params["iterations"], params["batch_size"], params["epochs"], params["seed"],
                params["learning_rate"])

    def compute_grid(self, params: dict | None = None):
        """One vmapped :func:`sweep_grid` over the map's beta x epsilon cells for ``params``."""
        params = self.current_params() if params is None else dict(params)
        grid = sweep_grid(self.config_for(params), self.grid_betas, self.grid_epsilons, self.rewards)
        return jax.device_get(grid)

    @property
    def pending(self) -> bool:
        """True while a coalesced update is scheduled but has not run yet."""
        return self._scheduler.pending

    def flush(self) -> None:
        """Run a pending coalesced update now (no-op if none is pending)."""
        if self._scheduler.pending:
            self._scheduler.cancel()
            self._update_now()

    def refresh(self) -> None:
        """Bring the run and the map up to date with the values in use, now."""
        self._update_now()

    def _update_now(self, include_grid: bool = True) -> None:
        """Bring the display up to date: the run first (cheap, visible at once), then the map.

        A new run is drawn together with the map's ring (both figures, then the widgets). A new
        map (new shape, seed or learning rate) is computed after that, so the run's numbers reach
        the browser before the map's longer computation (and first compile) starts.
        """
        params = self.current_params()
        try:
            if params != self.params:
                t0 = time.perf_counter()
                summary = self.compute(params)
                t1 = time.perf_counter()
                self.stats["computes"] += 1
                self._draw_run(params, summary)
                if self._grid_key is not None:
                    self._draw_map()  # the ring moves with beta/epsilon
                t2 = time.perf_counter()
                self.timings.append((t1 - t0, t2 - t1))
                self.status.value = (
                    f'<span class="ppo-timing">run {self.stats["computes"]}: compute {1e3 * (t1 - t0):.1f} ms, '
                    f"redraw {1e3 * (t2 - t1):.0f} ms · traces so far: trainer {TRACE_COUNTS['train']}, "
                    f"sweep {TRACE_COUNTS['sweep']}</span>"
                )
            if include_grid and self._grid_key_for(params) != self._grid_key:
                shape = (params["iterations"], params["batch_size"], params["epochs"])
                self._set_map_status(f"computing the map (a new shape {shape} compiles once) …")
                self.grid = self.compute_grid(params)
                self.grid_params = params
                self._grid_key = self._grid_key_for(params)
                self.stats["grid_computes"] += 1
                g = self.grid
                self._map.update_grid(
                    g.final_reward, g.final_kl,
                    f"{params['iterations']} rollouts × {params['batch_size']} × {params['epochs']} epochs, "
                    f"lr {params['learning_rate']:.3g}, seed {params['seed']}",
                )
                self._draw_map()
        except Exception as exc:  # shown in the widget: inside the kernel's loop it would be lost
            self.last_error = exc
            self._show_error(str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}")

    # ---- drawing -----------------------------------------------------------------------------

    def _draw_run(self, params: dict, summary: dict) -> None:
        self._panels.update(params, summary)
        png = self._panels.render()
        self.stats["renders"] += 1
        self._png = png
        self.params, self.last_summary = params, summary
        # Image first, readout last: when the readout shows new numbers, the picture is there.
        self.image.value = png
        self.readout.value = self._readout_html(params, summary, png)

    def _draw_map(self) -> None:
        beta, epsilon = self.params["beta"], self.params["epsilon"]
        self._map.update_marker(beta, epsilon)
        png = self._map.render()
        self.stats["map_renders"] += 1
        self._map_png = png
        self.map_image.value = png
        gp = self.grid_params
        data = {
            "grid-computes": self.stats["grid_computes"],
            "map-sha256": hashlib.sha256(png).hexdigest(),
            "marker-beta": repr(beta), "marker-epsilon": repr(epsilon),
            "grid-key": ",".join(str(v) for v in self._grid_key),
        }
        attrs = " ".join(f'data-{k}="{html.escape(str(v))}"' for k, v in data.items())
        self.map_status.value = (
            f'<div class="ppo-map-ready" {attrs}>map of {len(self.grid_betas)}×{len(self.grid_epsilons)} runs '
            f"({gp['iterations']} rollouts × {gp['batch_size']} × {gp['epochs']} epochs, lr {gp['learning_rate']:.3g}, "
            f"seed {gp['seed']}); ring at β = {beta:.4g}, ε = {epsilon:.3g}</div>"
        )

    def _set_map_status(self, text: str) -> None:
        self.map_status.value = f'<div class="ppo-map-busy">{html.escape(text)}</div>'

    def _readout_html(self, params: dict, s: dict, png: bytes) -> str:
        data = {
            "update": self.stats["computes"],
            **{k.replace("_", "-"): repr(v) for k, v in params.items()},
            **{k.replace("_", "-"): repr(s[k]) for k in (
                "final_reward", "final_kl", "objective_trained", "objective_optimum", "gap",
                "clip_fraction", "initial_reward")},
            "plot-sha256": hashlib.sha256(png).hexdigest(),
        }
        attrs = " ".join(f'data-{k}="{html.escape(str(v))}"' for k, v in data.items())

        def num(cls, value, text):
            return f'<span class="{cls}" data-value="{value!r}"><b>{html.escape(text)}</b></span>'

        warn = (' <span class="ppo-diverged" style="color:#b00020">the run diverged (non-finite values):'
                " lower the learning rate</span>") if s["diverged"] else ""
        return (
            f'<div class="ppo-readout-line" {attrs}>'
            f'final E[r] = {num("ppo-final-reward", s["final_reward"], format(s["final_reward"], ".4f"))}'
            f' · final KL = {num("ppo-final-kl", s["final_kl"], format(s["final_kl"], ".4f"))} nats'
            f' · objective E[r] − βKL = {num("ppo-objective", s["objective_trained"], format(s["objective_trained"], ".4f"))}'
            f' vs optimum {num("ppo-optimum", s["objective_optimum"], format(s["objective_optimum"], ".4f"))}'
            f' (gap {num("ppo-gap", s["gap"], format(s["gap"], ".4f"))})'
            f' · clipped in last batch: {num("ppo-clip-fraction", s["clip_fraction"], format(s["clip_fraction"], ".1%"))}'
            f"{warn}</div>"
        )

    # ---- display -----------------------------------------------------------------------------

    def show(self) -> None:
        """Display the explorer in the notebook (returns ``None`` so it is shown once)."""
        from IPython.display import display

        display(self.widget)

    def _ipython_display_(self) -> None:
        self.show()

    def close(self) -> None:
        """Cancel pending work and close this explorer's widgets (frees the front-end models)."""
        self._scheduler.cancel()
        for w in [*self.sliders.values(), *self.boxes.values(), self.error, self.readout, self.status,
                  self.map_status, self.image, self.map_image, self.widget]:
            w.close()


def explore(**kwargs) -> None:
    """Build a :class:`PPOExplorer` with ``kwargs`` and display it (the one-line notebook call)."""
    PPOExplorer(**kwargs).show()
