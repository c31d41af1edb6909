"""What the PPO explorer shows: the ipywidgets controls, the readout and the two pictures.

:class:`ExplorerView` builds the widgets once (a slider and a text box per parameter of
:data:`.model.PARAMS`, the error line, the readout, the two ``ipywidgets.Image`` widgets, the map
status and the timing line) and the two figures of :mod:`.figures`; its methods put plain results
(a :func:`.model.summary_numbers` dict, a map's NumPy arrays) on screen. It attaches no observers
and computes nothing: :mod:`.wiring` connects the widgets' events to the model and calls it.

*Drawing.* Replacing an image's PNG bytes swaps the picture without clearing the output area, so
nothing flickers, and it works headless and in JupyterLab 4 with only the pinned packages.

*No slider readouts.* An ipywidgets slider silently clamps an out-of-range number typed into its
readout, so the sliders here have none; each has a text box instead (validated by the wiring).

*Stable DOM hooks.* Widgets carry CSS classes (``ppo-beta-slider``, ``ppo-beta-box``,
``ppo-readout``, ``ppo-error``, ``ppo-plot``, ``ppo-map``, ``ppo-map-status`` ...). The readout's
``.ppo-readout-line`` element carries ``data-*`` attributes with the parameters and numbers at full
precision plus the SHA-256 of the PNG on screen (``data-plot-sha256``); ``.ppo-map-ready`` carries
the map's SHA-256, the ring's position and the number of map computations
(:func:`readout_html`, :func:`map_status_html`).

May import ipywidgets and IPython (when a view is built or shown), :mod:`.figures` and the
parameter table of :mod:`.model`; never :mod:`.wiring`, and it never calls the model.
"""
from __future__ import annotations

import hashlib
import html
import math
from typing import Any

import numpy as np

from .figures import MapPanel, ThreePanel
from .model import PARAMS, ParamSpec

__all__ = ["ExplorerView", "readout_html", "map_status_html", "error_html", "slider_position"]


# --------------------------------------------------------------------------------------------
# HTML of the readout, the map status and the error line (pure functions of plain values)
# --------------------------------------------------------------------------------------------


def _data_attrs(data: dict) -> str:
    return " ".join(f'data-{k}="{html.escape(str(v))}"' for k, v in data.items())


def readout_html(update: int, params: dict, s: dict, png: bytes) -> str:
    """The readout line of run number ``update`` (parameters ``params``, numbers ``s``, picture ``png``)."""
    data = {
        "update": update,
        **{k.replace("_", "-"): repr(v) for k, v in params.items()},
        **{k.replace("_", "-"): repr(s[k]) for k in (
            "final_reward", "final_kl", "objective_trained", "objective_optimum", "gap",
            "clip_fraction", "initial_reward")},
        "plot-sha256": hashlib.sha256(png).hexdigest(),
    }
    attrs = _data_attrs(data)

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


def map_status_html(png: bytes, beta: float, epsilon: float, grid_key: tuple, grid_params: dict,
                    grid_computes: int, cells: tuple[int, int]) -> str:
    """The line under the map: what it shows (``cells`` = (n_beta, n_epsilon)) and where the ring is."""
    data = {
        "grid-computes": grid_computes,
        "map-sha256": hashlib.sha256(png).hexdigest(),
        "marker-beta": repr(beta), "marker-epsilon": repr(epsilon),
        "grid-key": ",".join(str(v) for v in grid_key),
    }
    gp = grid_params
    return (
        f'<div class="ppo-map-ready" {_data_attrs(data)}>map of {cells[0]}×{cells[1]} runs '
        f"({gp['iterations']} rollouts × {gp['batch_size']} × {gp['epochs']} epochs, lr {gp['learning_rate']:.3g}, "
        f"seed {gp['seed']}); ring at β = {beta:.4g}, ε = {epsilon:.3g}</div>"
    )


def error_html(message: str) -> str:
    return (
        f'<div class="ppo-error-message" role="alert" style="color:#b00020;font-weight:600">'
        f"Rejected: {html.escape(message)}</div>"
    )


def slider_position(spec: ParamSpec, value: float) -> float:
    """Where ``value`` sits on its slider's axis (log10 for a log slider)."""
    return math.log10(value) if spec.log else float(value)


# --------------------------------------------------------------------------------------------
# The widgets
# --------------------------------------------------------------------------------------------


class ExplorerView:
    """The explorer's widgets and figures, built once for the starting ``values``.

    Args:
      values: the starting value of every parameter of :data:`.model.PARAMS`.
      rewards, ref_probs: NumPy vectors that fix the run figure's axis ranges.
      beta_edges, eps_edges: the map's cell edges (NumPy).
      dpi: resolution of the rendered figures.

    Attributes: ``sliders``/``boxes`` (by parameter name), ``error``, ``readout``, ``status``,
    ``map_status``, ``image``, ``map_image``, ``widget`` (the whole box), ``panels``/``map`` (the
    :class:`.figures.ThreePanel` and :class:`.figures.MapPanel`).
    """

    def __init__(self, values: dict, rewards: np.ndarray, ref_probs: np.ndarray, beta_edges, eps_edges,
                 dpi: float = 72.0):
        import ipywidgets as W

        self._W = W
        self.cells = (len(beta_edges) - 1, len(eps_edges) - 1)
        self.sliders: dict[str, Any] = {}
        self.boxes: dict[str, Any] = {}
        rows = []
        for spec in PARAMS:
            slider = self._make_slider(spec, values[spec.name])
            box = W.Text(value=format(values[spec.name], spec.fmt), continuous_update=False,
                         layout=W.Layout(width="7.5em"))
            css = spec.name.replace("_", "-")
            slider.add_class(f"ppo-{css}-slider")
            box.add_class(f"ppo-{css}-box")
            self.sliders[spec.name], self.boxes[spec.name] = slider, box
            rows.append(W.HBox([slider, box]))

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

        self.panels = ThreePanel(np.asarray(rewards), ref_probs, dpi)
        self.map = MapPanel(beta_edges, eps_edges, dpi)

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

    # ---- controls ----------------------------------------------------------------------------

    def show_value(self, spec: ParamSpec, value) -> None:
        """Write ``value`` into its text box (formatted exactly, not snapped)."""
        self.boxes[spec.name].value = format(value, spec.fmt)

    def show_error(self, message: str) -> None:
        self.error.value = error_html(message)

    def clear_error(self) -> None:
        if self.error.value:
            self.error.value = ""

    # ---- the run -----------------------------------------------------------------------------

    def render_run(self, params: dict, summary: dict) -> bytes:
        """Move the run figure's artists to ``summary`` and render it (nothing on screen changes yet)."""
        self.panels.update(params, summary)
        return self.panels.render()

    def show_run(self, update: int, params: dict, summary: dict, png: bytes) -> None:
        # Image first, readout last: when the readout shows new numbers, the picture is there.
        self.image.value = png
        self.readout.value = readout_html(update, params, summary, png)

    def show_timing(self, run: int, compute_s: float, draw_s: float, traces: dict) -> None:
        self.status.value = (
            f'<span class="ppo-timing">run {run}: compute {1e3 * compute_s:.1f} ms, '
            f"redraw {1e3 * draw_s:.0f} ms · traces so far: trainer {traces['train']}, "
            f"sweep {traces['sweep']}</span>"
        )

    # ---- the map -----------------------------------------------------------------------------

    def show_map_busy(self, text: str) -> None:
        self.map_status.value = f'<div class="ppo-map-busy">{html.escape(text)}</div>'

    def show_grid(self, final_reward, final_kl, params: dict) -> None:
        """Colour the map's cells with a new map's final reward and final KL (NumPy arrays)."""
        self.map.update_grid(
            final_reward, final_kl,
            f"{params['iterations']} rollouts × {params['batch_size']} × {params['epochs']} epochs, "
            f"lr {params['learning_rate']:.3g}, seed {params['seed']}",
        )

    def render_map(self, beta: float, epsilon: float) -> bytes:
        """Move the ring to (beta, epsilon) and render the map."""
        self.map.update_marker(beta, epsilon)
        return self.map.render()

    def show_map(self, png: bytes, beta: float, epsilon: float, grid_key: tuple, grid_params: dict,
                 grid_computes: int) -> None:
        self.map_image.value = png
        self.map_status.value = map_status_html(png, beta, epsilon, grid_key, grid_params, grid_computes,
                                                self.cells)

    # ---- display -----------------------------------------------------------------------------

    def display(self) -> None:
        from IPython.display import display

        display(self.widget)

    def close(self) -> None:
        """Close every widget (frees the front-end models)."""
        for w in [*self.sliders.values(), *self.boxes.values(), self.error, self.readout, self.status,
                  self.map_status, self.image, self.map_image, self.widget]:
            w.close()
