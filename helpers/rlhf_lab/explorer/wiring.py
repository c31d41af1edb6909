"""The PPO explorer itself: slider and box events -> the model's numbers -> the view.

:class:`PPOExplorer` owns one :class:`.model.ExplorerModel` (what is computed), one
:class:`.view.ExplorerView` (what is shown) and one :class:`.scheduler.LatestWins` (when an update
runs). It holds the exact values in use, validates typed values, tells a slider's own snapping echo
from a user's move, decides what an update must recompute (the run always, the map only when its
inputs changed) and hands the model's plain results to the view.

*Typed values are validated, not clamped, and used exactly.* A typed value is checked with
:meth:`.model.ParamSpec.validate` (the library's own messages) and against the slider's range; a
bad one is rejected with a red message and the box reverts to the value in use. A good one is used
as typed: the slider's front end may answer with the nearest point of its step grid, and that echo
(within half a step of the value just set) is ignored, while a user's move (at least half a step
away) is taken.

*The map is recomputed only when it can change*: its cells depend on the shape, the seed and the
learning rate, not on the sliders' beta/epsilon, so moving beta/epsilon only moves the ring. The
first map needs its own (larger) compile, so inside a kernel it is computed just after the
explorer is first shown. The costly sliders (shape, learning rate, seed) use
``continuous_update=False`` and send their value when released.

May import :mod:`.model`, :mod:`.view` and :mod:`.scheduler` (and the trainer's ``TRACE_COUNTS``).
"""
from __future__ import annotations

import collections
import functools
import time

from ..trainer import TRACE_COUNTS, PPOConfig
from .model import PARAMS, SPECS, ExplorerModel, ParamSpec
from .scheduler import LatestWins
from .view import ExplorerView, slider_position

__all__ = ["PPOExplorer", "explore"]


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
      model, view: the :class:`.model.ExplorerModel` and :class:`.view.ExplorerView` it connects.
    """

    def __init__(self, config: PPOConfig | None = None, rewards=None, grid_size=(16, 16),
                 delay: float = 0.03, dpi: float = 72.0):
        import ipywidgets  # noqa: F401  (fail here, before any computation, if it is missing)

        config = PPOConfig() if config is None else config
        if not isinstance(config, PPOConfig):
            raise ValueError(f"config must be a PPOConfig, got {type(config).__name__}")
        self.model = model = ExplorerModel(config.init_logits, rewards, grid_size)
        self.init_logits, self.rewards = model.init_logits, model.rewards
        self.beta_edges, self.grid_betas = model.beta_edges, model.grid_betas
        self.eps_edges, self.grid_epsilons = model.eps_edges, model.grid_epsilons
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
        self._values = model.initial_values(config)

        self.view = view = ExplorerView(self._values, self.rewards, model.reference_probs(),
                                        self.beta_edges, self.eps_edges, dpi)
        self.sliders, self.boxes, self.widget = view.sliders, view.boxes, view.widget
        self.error, self.readout, self.status = view.error, view.readout, view.status
        self.image, self.map_image, self.map_status = view.image, view.map_image, view.map_status
        self._panels, self._map = view.panels, view.map
        self.fig, self.map_fig = view.panels.fig, view.map.fig
        for spec in PARAMS:
            self.sliders[spec.name].observe(functools.partial(self._on_slider, spec), names="value")
            self.boxes[spec.name].observe(functools.partial(self._on_box, spec), names="value")
            self._expect_echo(spec)  # a log slider sends its snapped start value when it renders

        # The run on screen is computed now (first compile happens here). The map needs its own,
        # larger compile: inside a kernel it is scheduled on the event loop so the explorer shows
        # up first; without a running loop it is computed right away.
        self._update_now(include_grid=False)
        self._scheduler.request()

    # ---- events ------------------------------------------------------------------------------

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
            distance = abs(slider_position(spec, new) - slider_position(spec, self._values[spec.name]))
            if distance <= 0.5 * spec.step + 1e-9:
                self.stats["echoes"] += 1
                return
        self._values[spec.name] = float(new) if spec.kind == "float" else int(new)
        self._sync_box(spec)
        self.view.clear_error()
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
            self.view.show_error(str(exc))
            self._sync_box(spec)  # the box goes back to the value in use
            return
        self.view.clear_error()
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
            self.view.show_value(spec, self._values[spec.name])
        finally:
            self._pushing = False

    # ---- state -------------------------------------------------------------------------------

    def current_params(self) -> dict:
        """The exact values in use (a typed value is used as typed, not snapped to the slider step)."""
        return dict(self._values)

    def config_for(self, params: dict) -> PPOConfig:
        """The validated :class:`PPOConfig` for slider values ``params``."""
        return self.model.config_for(params)

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
        :func:`summary_numbers` plus ``params`` and ``diverged`` (:meth:`.model.ExplorerModel.run`).
        """
        return self.model.run(self.current_params() if params is None else params)

    def compute_grid(self, params: dict | None = None):
        """One vmapped :func:`sweep_grid` over the map's beta x epsilon cells for ``params``."""
        return self.model.grid(self.current_params() if params is None else params)

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
                self.view.show_timing(self.stats["computes"], t1 - t0, t2 - t1, TRACE_COUNTS)
            grid_key = self.model.grid_key(params)
            if include_grid and grid_key != self._grid_key:
                shape = (params["iterations"], params["batch_size"], params["epochs"])
                self.view.show_map_busy(f"computing the map (a new shape {shape} compiles once) …")
                self.grid = self.compute_grid(params)
                self.grid_params = params
                self._grid_key = grid_key
                self.stats["grid_computes"] += 1
                self.view.show_grid(self.grid.final_reward, self.grid.final_kl, params)
                self._draw_map()
        except Exception as exc:  # shown in the widget: inside the kernel's loop it would be lost
            self.last_error = exc
            self.view.show_error(str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}")

    # ---- drawing -----------------------------------------------------------------------------

    def _draw_run(self, params: dict, summary: dict) -> None:
        png = self.view.render_run(params, summary)
        self.stats["renders"] += 1
        self._png = png
        self.params, self.last_summary = params, summary
        self.view.show_run(self.stats["computes"], params, summary, png)

    def _draw_map(self) -> None:
        beta, epsilon = self.params["beta"], self.params["epsilon"]
        png = self.view.render_map(beta, epsilon)
        self.stats["map_renders"] += 1
        self._map_png = png
        self.view.show_map(png, beta, epsilon, self._grid_key, self.grid_params, self.stats["grid_computes"])

    # ---- display -----------------------------------------------------------------------------

    def show(self) -> None:
        """Display the explorer in the notebook (returns ``None`` so it is shown once)."""
        self.view.display()

    def _ipython_display_(self) -> None:
        self.show()

    def close(self) -> None:
        """Cancel pending work and close this explorer's widgets (frees the front-end models)."""
        self._scheduler.cancel()
        self.view.close()


def explore(**kwargs) -> None:
    """Build a :class:`PPOExplorer` with ``kwargs`` and display it (the one-line notebook call)."""
    PPOExplorer(**kwargs).show()
