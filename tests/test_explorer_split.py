"""The explorer's split into model (what is computed), view (widgets, figures) and wiring.

* The model computes a run and a map in a fresh interpreter without ever importing a widget or
  plotting library (ipywidgets, IPython, matplotlib, Pillow: ``sys.modules`` after the fact), so
  what is computed is separable from what is shown. (The package's ``__init__`` imports the view
  module eagerly, so the library builds see every explorer module; the view imports ipywidgets and
  matplotlib only when a view is built.)
* Inside the package the layers only import downwards: the model imports none of the other
  explorer modules, the figures none of them, the view never the wiring.
* What the explorer shows for one setting is what a separate model instance computes for it: the
  numbers are read back from the widgets' state (the readout's ``data-*`` attributes, the text
  boxes, the map status, the heatmaps and the PNG on screen), not from the explorer's own results.

Small shapes (5 rollouts x 8 samples x 1 epoch, a 3 x 2 map) keep the compiles short.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np
import pytest
from test_import_graph import graph

SMALL = dict(iterations=5, batch_size=8, epochs=1, learning_rate=0.2, seed=3)
GRID = (3, 2)


def test_the_model_computes_without_importing_widgets_or_plotting():
    code = f"""
import json, sys
from rlhf_lab.explorer.model import ExplorerModel, PARAMS
from rlhf_lab.trainer import PPOConfig
config = PPOConfig(**{SMALL!r})
model = ExplorerModel(config.init_logits, grid_size={GRID!r})
params = model.initial_values(config)
run = model.run(params)
grid = model.grid(params)
banned = ("ipywidgets", "IPython", "matplotlib", "PIL")
print(json.dumps({{"loaded": sorted(m for m in sys.modules if m.split(".")[0] in banned),
                   "final_reward": run["final_reward"], "cells": list(grid.final_reward.shape)}}))
"""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("MPLBACKEND", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["loaded"] == [], f"the explorer's model imported {report['loaded']}"
    assert np.isfinite(report["final_reward"]) and report["cells"] == list(GRID)


def test_inside_the_explorer_layers_only_import_downwards():
    edges = graph()
    pkg = "rlhf_lab.explorer"
    mods = {name for name in edges if name.startswith(pkg + ".")}
    assert {f"{pkg}.{m}" for m in ("model", "figures", "view", "scheduler", "wiring")} <= mods, sorted(mods)

    def inside(name):
        return {t for t in edges[name] if t == pkg or t.startswith(pkg + ".")}

    assert inside(f"{pkg}.model") == set(), "the model must not import the view, the figures or the wiring"
    assert inside(f"{pkg}.figures") == set()
    assert inside(f"{pkg}.scheduler") == set()
    assert inside(f"{pkg}.view") <= {f"{pkg}.model", f"{pkg}.figures"}
    assert f"{pkg}.wiring" not in inside(f"{pkg}.view")


class _Attrs(HTMLParser):
    def __init__(self, css_class):
        super().__init__()
        self.css_class, self.found = css_class, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if self.found is None and self.css_class in (attrs.get("class") or "").split():
            self.found = {k[5:]: v for k, v in attrs.items() if k.startswith("data-")}


def _data(html_text: str, css_class: str) -> dict:
    parser = _Attrs(css_class)
    parser.feed(html_text)
    assert parser.found is not None, f"no .{css_class} in {html_text[:300]!r}"
    return parser.found


@pytest.fixture(scope="module")
def small_explorer():
    from rlhf_lab.explorer import PPOExplorer
    from rlhf_lab.trainer import PPOConfig

    ex = PPOExplorer(config=PPOConfig(**SMALL), grid_size=GRID)
    yield ex
    ex.close()


def test_what_the_explorer_shows_is_what_the_model_computes(small_explorer):
    from rlhf_lab.explorer.model import SPECS, ExplorerModel
    from rlhf_lab.trainer import PPOConfig

    ex = small_explorer
    ex.boxes["beta"].value = "0.7"         # typed, as a student would
    ex.sliders["epsilon"].value = 0.33      # dragged
    params = dict(SMALL, beta=0.7, epsilon=0.33)
    model = ExplorerModel(PPOConfig().init_logits, grid_size=GRID)  # a separate instance
    want = model.run(params)
    grid = model.grid(params)

    shown = _data(ex.readout.value, "ppo-readout-line")
    for key in ("final_reward", "final_kl", "objective_trained", "objective_optimum", "gap",
                "clip_fraction", "initial_reward"):
        assert float(shown[key.replace("_", "-")]) == want[key], key
    for name, value in params.items():
        assert float(shown[name.replace("_", "-")]) == value, name
        assert ex.boxes[name].value == format(value, SPECS[name].fmt), name
    assert shown["plot-sha256"] == hashlib.sha256(ex.image.value).hexdigest()
    # The picture on screen carries the model's series and probabilities.
    np.testing.assert_array_equal(ex.view.panels.reward_line.get_ydata(), want["reward"])
    np.testing.assert_array_equal(ex.view.panels.kl_line.get_ydata(), want["kl"])
    assert [r.get_height() for r in ex.view.panels.bars["final"]] == want["final_probs"]
    assert [r.get_height() for r in ex.view.panels.bars["optimum"]] == want["optimum_probs"]
    # The map: its status line, its ring and its cells.
    status = _data(ex.map_status.value, "ppo-map-ready")
    assert (float(status["marker-beta"]), float(status["marker-epsilon"])) == (0.7, 0.33)
    assert status["grid-key"] == ",".join(str(v) for v in model.grid_key(params))
    assert status["map-sha256"] == hashlib.sha256(ex.map_image.value).hexdigest()
    for mesh, values in zip(ex.view.map.meshes, (grid.final_reward, grid.final_kl)):
        np.testing.assert_array_equal(np.asarray(mesh.get_array()).ravel(), np.asarray(values).ravel())
