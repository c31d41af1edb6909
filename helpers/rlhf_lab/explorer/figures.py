"""The explorer's figures: a three-panel run figure and a beta x epsilon map, blitted to PNG bytes.

Matplotlib only (imported when a figure is made, so importing this module is cheap): two
:class:`matplotlib.figure.Figure` objects with an Agg canvas (no pyplot state, no ipympl) are
created once; updates call ``set_data``/``set_ydata``/``set_height``/``set_array`` on their artists
and render the *same* figures to PNG bytes (Pillow). The changing artists are ``animated`` and
drawn over a cached background (blitting): the axes ranges are fixed by the rewards and the
reference (``E[r]`` lies in ``[min r, max r]``, ``KL <= max -log pi_ref``), so a beta/epsilon move
redraws only the data: many times faster than a full redraw (figures in
``bench/results/explorer.md``). ``rlhf_lab.plots`` draws the lesson's static figure; it rescales
its axes and uses constrained layout on every update, which costs a full redraw each time, so the
explorer keeps its own figure code (same colours: reference grey, PPO blue, optimum red).

Input: plain numbers (a :func:`.model.summary_numbers` dict, NumPy arrays); output: PNG bytes.
May import matplotlib, Pillow and NumPy; never ``ipywidgets``, JAX or the rest of the explorer.
"""
from __future__ import annotations

import io

import numpy as np

__all__ = ["BlitFigure", "ThreePanel", "MapPanel", "COLORS", "new_figure", "encode_png"]

COLORS = {"reference": "#7f7f7f", "final": "#1f77b4", "optimum": "#d62728"}


def new_figure(width: float, height: float, dpi: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def encode_png(rgba, width: int, height: int, compress_level: int = 1) -> bytes:
    """PNG bytes of an RGBA buffer (Pillow; level 1 is ~as small as the default and much faster)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.frombuffer("RGBA", (width, height), rgba, "raw", "RGBA", 0, 1).save(
        buf, format="png", compress_level=compress_level
    )
    return buf.getvalue()


class BlitFigure:
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
        return encode_png(canvas.buffer_rgba(), width, height)


class ThreePanel:
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
        self.fig = new_figure(12.0, 3.5, dpi)
        self.fig.subplots_adjust(left=0.06, right=0.99, bottom=0.15, top=0.80, wspace=0.28)
        ax_r, ax_kl, ax_p = self.fig.subplots(1, 3)
        self.axes = (ax_r, ax_kl, ax_p)
        x = np.arange(1, 2)
        (self.reward_line,) = ax_r.plot(x, x * 0.0, color=COLORS["final"], lw=1.8)
        self.reward_ref = ax_r.axhline(0.0, color=COLORS["reference"], ls="--", lw=1.2)
        self.reward_opt = ax_r.axhline(0.0, color=COLORS["optimum"], ls=":", lw=1.6)
        lo, hi = float(np.min(rewards)), float(np.max(rewards))
        pad = 0.05 * (hi - lo if hi > lo else 1.0)
        ax_r.set_ylim(lo - pad, hi + pad)
        ax_r.set_xlabel("rollout batch (count)")
        ax_r.set_ylabel("E_π[r] (reward units)")
        ax_r.set_title("Expected learned reward", fontsize=10)
        (self.kl_line,) = ax_kl.plot(x, x * 0.0, color=COLORS["final"], lw=1.8)
        self.kl_opt = ax_kl.axhline(0.0, color=COLORS["optimum"], ls=":", lw=1.6)
        kl_max = float(np.max(-np.log(ref_probs)))
        ax_kl.set_ylim(-0.03 * kl_max, 1.05 * kl_max)
        ax_kl.set_xlabel("rollout batch (count)")
        ax_kl.set_ylabel("KL(π ‖ π_ref) (nats)")
        ax_kl.set_title("KL to the reference", fontsize=10)
        idx = np.arange(n_actions)
        width = 0.26
        self.bars = {}
        for k, name in enumerate(("reference", "final", "optimum")):
            self.bars[name] = list(ax_p.bar(idx + (k - 1) * width, np.zeros(n_actions), width, color=COLORS[name]))
        ax_p.set_xticks(idx, [f"action {i}" for i in idx])
        ax_p.set_ylim(0.0, 1.0)
        ax_p.set_ylabel("probability (fraction)")
        ax_p.set_xlabel("action")
        ax_p.set_title("Action probabilities", fontsize=10)
        handles = [
            (Line2D([], [], color=COLORS[name], ls=ls), Patch(color=COLORS[name]))
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
        self.blit = BlitFigure(self.fig, dynamic)

    def update(self, params: dict, s: dict) -> None:
        """Move the artists to run ``s`` (a :func:`.model.summary_numbers` dict); the figure is reused."""
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


class MapPanel:
    """Final reward and final KL over the beta x epsilon grid, with the slider point marked."""

    def __init__(self, beta_edges, eps_edges, dpi: float):
        self.fig = new_figure(9.0, 3.3, dpi)
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
        self.blit = BlitFigure(self.fig, dynamic)

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

