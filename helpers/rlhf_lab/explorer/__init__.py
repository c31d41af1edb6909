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

Layout (one responsibility per module; each imports only the ones listed before it)
--------------------------------------------------------------------------------------
* :mod:`.model`: what is computed. The parameter table (:data:`PARAMS`, :class:`ParamSpec` and
  its validation), one compiled run per setting (:meth:`ExplorerModel.run`, numbers from
  :func:`summary_numbers`), the map (one vmapped ``sweep_grid``), PRNG keys. JAX and the library
  only: no ipywidgets, IPython or matplotlib.
* :mod:`.figures`: the two matplotlib figures (Agg canvas, no pyplot), blitted to PNG bytes.
* :mod:`.view`: the widgets (sliders, boxes, readout, images, status lines) and their HTML; it
  puts the model's plain results on screen and computes nothing.
* :mod:`.scheduler`: :class:`LatestWins`, the coalescing of update requests on the event loop.
* :mod:`.wiring`: :class:`PPOExplorer` and :func:`explore`: slider and box events -> validated
  exact values -> the model -> the view (echo handling, when the map must be recomputed).

Design notes
------------
*No recompilation for beta/epsilon/lr/seed* (:mod:`.model`): beta, epsilon and the learning rate
are traced arguments of the program cached by :func:`rlhf_lab.trainer.make_train`, and the seed
only changes the PRNG key *value*; only a new shape (rollouts, batch size, epochs) traces and
compiles, once per shape. ``rlhf_lab.trainer.TRACE_COUNTS`` counts every trace (keys ``train``,
``sweep`` and ``explorer_summary``), so tests can prove that moving beta or epsilon does not
recompile. *The map is recomputed only when it can change* and *typed values are validated, not
clamped, and used exactly* (:mod:`.wiring`). *Coalescing ("latest wins")*: a burst of slider
changes costs one run, with the newest values (:mod:`.scheduler`); without a running event loop
each change updates synchronously and :meth:`PPOExplorer.set` groups several into one update.
*Drawing* (:mod:`.figures`, :mod:`.view`): the same two figures are updated in place and blitted;
replacing an ``ipywidgets.Image``'s bytes swaps the picture without flicker. *Stable DOM hooks*
(:mod:`.view`): CSS classes such as ``ppo-beta-slider`` and ``data-*`` attributes on
``.ppo-readout-line`` and ``.ppo-map-ready`` (numbers at full precision, SHA-256 of the picture
on screen) let a browser test read exactly what was computed and shown.
"""
from __future__ import annotations

from .model import PARAMS, SPECS, ExplorerModel, ParamSpec, summary_numbers
from .scheduler import LatestWins
from .wiring import PPOExplorer, explore

__all__ = ["PPOExplorer", "ParamSpec", "PARAMS", "SPECS", "ExplorerModel", "LatestWins", "explore", "summary_numbers"]
