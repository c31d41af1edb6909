"""Fast tests of the live PPO explorer (no browser): numbers, no recompilation, validation, coalescing.

One explorer is shared by the module (its construction compiles the trainer and the map). Each test
sets the values it needs. Slider changes are made by assigning ``slider.value``, which is what the
front end's messages do; without a running event loop the explorer updates synchronously, and the
coalescing test runs an asyncio loop to see the deferred ("latest wins") behaviour.
"""
from __future__ import annotations

import asyncio
import hashlib
import html
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from rlhf_lab import explorer as explorer_mod
from rlhf_lab.explorer import PPOExplorer
from rlhf_lab.lesson import RECORDED, summarise
from rlhf_lab.sweep import sweep_grid
from rlhf_lab.trainer import TRACE_COUNTS, PPOConfig, lesson_rewards, train

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "source" / "a2c_ppo_explorer" / "explorer.ipynb"
LESSON = dict(beta=0.2, epsilon=0.2, learning_rate=0.15, epochs=3, batch_size=128, iterations=40, seed=11)


@pytest.fixture(scope="module")
def ex():
    explorer = PPOExplorer()
    yield explorer
    explorer.close()


@pytest.fixture(scope="module")
def rewards():
    return lesson_rewards()


@pytest.fixture
def lesson_state(ex):
    """Put the explorer back on the lesson's values before a test (one update at most)."""
    ex.set(**LESSON)
    assert ex.params == LESSON
    return ex


class _DataAttrs(HTMLParser):
    def __init__(self, css_class):
        super().__init__()
        self.css_class, self.found = css_class, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if self.found is None and self.css_class in (attrs.get("class") or "").split():
            self.found = {k[5:]: v for k, v in attrs.items() if k.startswith("data-")}


def data_attrs(html_text: str, css_class: str) -> dict:
    parser = _DataAttrs(css_class)
    parser.feed(html_text)
    assert parser.found is not None, f"no element with class {css_class!r} in {html_text[:300]!r}"
    return parser.found


def expected_numbers(params: dict, rewards) -> tuple[dict, object]:
    """What the library computes for these slider values (train + summarise, independent path)."""
    config = PPOConfig(**params)
    result = train(config, rewards)
    return summarise(result, rewards, config.beta), result


def assert_matches_library(ex, rewards):
    params = ex.params
    want, result = expected_numbers(params, rewards)
    got = ex.last_summary
    # The run itself comes from the same compiled trainer: bit-identical.
    assert got["final_reward"] == want["final_reward"], (params, got["final_reward"], want["final_reward"])
    assert got["final_kl"] == want["final_kl"], (params, got["final_kl"], want["final_kl"])
    assert got["initial_reward"] == want["initial_reward"]
    assert got["clip_fraction"] == float(np.asarray(result.clip_frac)[-1])
    np.testing.assert_array_equal(got["reward"], np.asarray(result.reward))
    np.testing.assert_array_equal(got["kl"], np.asarray(result.kl))
    # The objectives are recomputed (jitted here, eager in summarise): float32 rounding only.
    for key in ("objective_reference", "objective_trained", "objective_optimum"):
        np.testing.assert_allclose(got[key], want[key], rtol=2e-6, atol=1e-6, err_msg=f"{key} for {params}")
    for key in ("final_probs", "optimum_probs", "reference_probs"):
        np.testing.assert_allclose(got[key], want[key], rtol=2e-6, atol=1e-7, err_msg=f"{key} for {params}")
    np.testing.assert_allclose(got["gap"], want["objective_optimum"] - want["objective_trained"], atol=2e-6)
    # The readout in the DOM carries the same numbers at full precision, and the parameters used.
    attrs = data_attrs(ex.readout.value, "ppo-readout-line")
    assert float(attrs["final-reward"]) == got["final_reward"]
    assert float(attrs["final-kl"]) == got["final_kl"]
    assert float(attrs["objective-trained"]) == got["objective_trained"]
    assert float(attrs["objective-optimum"]) == got["objective_optimum"]
    assert float(attrs["gap"]) == got["gap"]
    assert float(attrs["clip-fraction"]) == got["clip_fraction"]
    for name, value in params.items():
        assert float(attrs[name.replace("_", "-")]) == value, (name, attrs)
    assert attrs["plot-sha256"] == hashlib.sha256(ex.image.value).hexdigest()


def test_lesson_values_reproduce_the_recorded_run(ex, rewards, lesson_state):
    s = ex.last_summary
    assert abs(s["initial_reward"] - RECORDED["initial_reward"]) < 1e-5
    assert abs(s["final_reward"] - RECORDED["final_reward"]) < 1e-5
    assert abs(s["final_kl"] - RECORDED["final_kl"]) < 1e-5
    assert abs(s["objective_trained"] - RECORDED["objective_trained"]) < 1e-5
    assert abs(s["objective_optimum"] - RECORDED["objective_optimum"]) < 1e-5
    assert_matches_library(ex, rewards)


def test_slider_changes_give_the_library_numbers(ex, rewards, lesson_state):
    rng = np.random.default_rng(20241)
    for _ in range(3):
        beta = float(np.exp(rng.uniform(np.log(0.02), np.log(5.0))))
        epsilon = float(rng.uniform(0.02, 0.9))
        ex.sliders["beta"].value = beta
        assert ex.params["beta"] == beta
        assert_matches_library(ex, rewards)
        ex.sliders["epsilon"].value = epsilon
        assert ex.params == dict(LESSON, beta=beta, epsilon=epsilon)
        assert_matches_library(ex, rewards)
    # Learning rate and seed too (set together: one run and one new map, see the map test for sliders).
    learning_rate = float(np.exp(rng.uniform(np.log(0.02), np.log(0.8))))
    seed = int(rng.integers(0, 999))
    computes, grid_computes = ex.stats["computes"], ex.stats["grid_computes"]
    ex.set(learning_rate=learning_rate, seed=seed)
    assert ex.stats["computes"] == computes + 1 and ex.stats["grid_computes"] == grid_computes + 1
    assert ex.params == dict(LESSON, beta=beta, epsilon=epsilon, learning_rate=learning_rate, seed=seed)
    assert_matches_library(ex, rewards)


def test_beta_and_epsilon_never_retrace_or_recompute_the_map(ex, rewards, lesson_state):
    traces = dict(TRACE_COUNTS)
    grid_computes, computes = ex.stats["grid_computes"], ex.stats["computes"]
    fig, line, png = ex.fig, ex._panels.reward_line, ex.image.value
    map_png = ex.map_image.value
    values = np.geomspace(0.03, 3.0, 12)
    for i, beta in enumerate(values):
        ex.sliders["beta"].value = float(beta)
        ex.boxes["epsilon"].value = f"{0.05 + 0.06 * i:.2f}"  # typed values take the same path
    assert dict(TRACE_COUNTS) == traces, "moving beta/epsilon traced (compiled) again"
    assert ex.stats["grid_computes"] == grid_computes, "the map was recomputed for a beta/epsilon move"
    assert ex.stats["computes"] == computes + 2 * len(values)
    # Same figure and artists, new pixels; the map marker sits at the slider point.
    assert ex.fig is fig and ex._panels.reward_line is line
    assert ex.image.value != png and ex.map_image.value != map_png
    beta, epsilon = ex.params["beta"], ex.params["epsilon"]
    for marker in ex._map.markers:
        xs, ys = marker.get_data()
        assert (float(xs[0]), float(ys[0])) == (epsilon, beta)
    attrs = data_attrs(ex.map_status.value, "ppo-map-ready")
    assert float(attrs["marker-beta"]) == beta and float(attrs["marker-epsilon"]) == epsilon
    assert attrs["map-sha256"] == hashlib.sha256(ex.map_image.value).hexdigest()
    assert_matches_library(ex, rewards)


def test_map_is_one_sweep_and_follows_lr_and_seed_without_retracing(ex, rewards, lesson_state):
    config = PPOConfig(**LESSON)
    want = sweep_grid(config, ex.grid_betas, ex.grid_epsilons, rewards)
    np.testing.assert_array_equal(ex.grid.final_reward, np.asarray(want.final_reward))
    np.testing.assert_array_equal(ex.grid.final_kl, np.asarray(want.final_kl))
    # The heatmaps show those arrays.
    np.testing.assert_array_equal(np.asarray(ex._map.meshes[0].get_array()).ravel(), np.asarray(want.final_reward).ravel())
    np.testing.assert_array_equal(np.asarray(ex._map.meshes[1].get_array()).ravel(), np.asarray(want.final_kl).ravel())
    traces = dict(TRACE_COUNTS)
    grid_computes = ex.stats["grid_computes"]
    ex.sliders["learning_rate"].value = 0.3
    ex.sliders["seed"].value = 5
    assert ex.stats["grid_computes"] == grid_computes + 2
    assert dict(TRACE_COUNTS) == traces, "a learning-rate or seed change traced again"
    want = sweep_grid(PPOConfig(**dict(LESSON, learning_rate=0.3, seed=5)), ex.grid_betas, ex.grid_epsilons, rewards)
    np.testing.assert_array_equal(ex.grid.final_reward, np.asarray(want.final_reward))
    assert_matches_library(ex, rewards)


def test_shape_change_compiles_once_then_is_cached(ex, rewards, lesson_state):
    # A batch size no other test uses, so its programs are certainly not compiled yet.
    batch = int(np.random.default_rng().integers(300, 500))
    before = dict(TRACE_COUNTS)
    ex.sliders["batch_size"].value = batch
    first = dict(TRACE_COUNTS)
    assert first.get("sweep", 0) == before.get("sweep", 0) + 1, "the new shape's map program was not compiled"
    assert first.get("train", 0) > before.get("train", 0), "the new shape's trainer was not compiled"
    assert_matches_library(ex, rewards)
    ex.sliders["batch_size"].value = 128  # back to a compiled shape
    ex.sliders["beta"].value = 0.7
    ex.sliders["batch_size"].value = batch  # and to the new one again
    ex.sliders["epsilon"].value = 0.33
    assert dict(TRACE_COUNTS) == first, "a shape that was already compiled was traced again"
    assert_matches_library(ex, rewards)


def _pixels(png):
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"))


def test_blitted_picture_equals_a_full_redraw(ex, lesson_state):
    # Real runs: beta and epsilon moves reuse the cached background.
    for change in ({"beta": 1.3}, {"epsilon": 0.6}):
        ex.set(**change)
        blitted, blitted_map = ex.image.value, ex.map_image.value
        ex._panels.blit.invalidate()
        ex._map.blit.invalidate()
        assert np.array_equal(_pixels(blitted), _pixels(ex._panels.render())), f"stale background after {change}"
        assert np.array_equal(_pixels(blitted_map), _pixels(ex._map.render())), f"stale map after {change}"
    s = ex.last_summary
    np.testing.assert_array_equal(ex._panels.reward_line.get_ydata(), s["reward"])
    np.testing.assert_array_equal(ex._panels.kl_line.get_ydata(), s["kl"])
    assert [r.get_height() for r in ex._panels.bars["final"]] == s["final_probs"]
    assert [r.get_height() for r in ex._panels.bars["optimum"]] == s["optimum_probs"]
    # A new number of rollouts (new x range) and a new map (new colour scale) must redraw the
    # static part too; checked with made-up data so no new shape has to compile here.
    panels, grid_map = ex._panels, ex._map
    fake = dict(s, reward=np.linspace(0.3, 1.5, 17), kl=np.linspace(0.0, 0.5, 17))
    panels.update(dict(ex.params, iterations=17), fake)
    blitted = panels.render()
    panels.blit.invalidate()
    assert np.array_equal(_pixels(blitted), _pixels(panels.render())), "x range changed but background was reused"
    assert panels.axes[0].get_xlim() == (0.5, 17.5)
    n_b, n_e = len(ex.grid_betas), len(ex.grid_epsilons)
    grid_map.update_grid(np.arange(n_b * n_e).reshape(n_b, n_e), np.ones((n_b, n_e)), "made-up map")
    blitted = grid_map.render()
    grid_map.blit.invalidate()
    assert np.array_equal(_pixels(blitted), _pixels(grid_map.render())), "map changed but background was reused"
    # Put the real run back on screen.
    ex.params = None
    ex._grid_key = None
    ex.refresh()
    assert ex._panels.axes[0].get_xlim() == (0.5, 40.5)


@pytest.mark.parametrize(
    "name, typed, fragment",
    [
        ("beta", "-1", "must be > 0"),
        ("beta", "0", "must be > 0"),
        ("beta", "50", "outside this explorer's range"),
        ("beta", "abc", "must be a finite real number"),
        ("epsilon", "1.5", "open interval (0, 1)"),
        ("epsilon", "nan", "must be finite"),
        ("learning_rate", "-0.1", "must be > 0"),
        ("batch_size", "2000", "outside this explorer's range"),
        ("batch_size", "12.5", "must be an integer"),
        ("epochs", "0", "must be an integer >= 1"),
        ("seed", "-3", "must be an integer >= 0"),
        ("iterations", "", "needs a value"),
    ],
)
def test_typed_out_of_range_value_is_rejected_visibly(ex, lesson_state, name, typed, fragment):
    computes, traces = ex.stats["computes"], dict(TRACE_COUNTS)
    slider_value = ex.sliders[name].value
    ex.boxes[name].value = typed
    assert "ppo-error-message" in ex.error.value and "color:#b00020" in ex.error.value
    message = html.unescape(re.sub(r"<[^>]+>", "", ex.error.value))
    assert name in message and fragment in message, message
    # Nothing changed: the value in use, the slider, the run, and the box shows the value in use.
    assert ex.params == LESSON and ex.sliders[name].value == slider_value
    assert ex.stats["computes"] == computes and dict(TRACE_COUNTS) == traces
    assert ex.boxes[name].value == format(LESSON[name], explorer_mod.SPECS[name].fmt)
    # A valid value afterwards clears the message and is used exactly as typed.
    # (shape parameters get their current value, typed differently, so nothing new compiles here)
    good = {"beta": "0.237", "epsilon": "0.237", "learning_rate": "0.237", "batch_size": "128.0",
            "epochs": "3.0", "seed": "12", "iterations": "40.0"}[name]
    ex.boxes[name].value = good
    assert ex.error.value == ""
    want = float(good) if explorer_mod.SPECS[name].kind == "float" else int(float(good))
    assert ex.params[name] == want and type(ex.params[name]) is type(want)


def test_front_end_snapping_echo_keeps_the_typed_value(ex, rewards, lesson_state):
    ex.boxes["epsilon"].value = "0.237"
    assert ex.params["epsilon"] == 0.237
    computes = ex.stats["computes"]
    ex.sliders["epsilon"].value = 0.24  # the slider's front end answers with its nearest step
    assert ex.params["epsilon"] == 0.237 and ex.stats["computes"] == computes
    ex.sliders["epsilon"].value = 0.25  # a real move by the user
    assert ex.params["epsilon"] == 0.25 and ex.stats["computes"] == computes + 1
    ex.boxes["beta"].value = "0.5"
    ex.sliders["beta"].value = 10 ** -0.3  # log slider: 0.5 sits between steps 10**-0.3 and 10**-0.35
    assert ex.params["beta"] == 0.5
    assert_matches_library(ex, rewards)


def test_rapid_changes_coalesce_latest_wins(ex, rewards, lesson_state):
    """Inside an event loop, a burst of changes costs one run, with the newest values."""
    computed = []
    original = ex.compute

    def recording_compute(params=None):
        out = original(params)
        computed.append(out["params"])
        return out

    ex.compute = recording_compute
    try:
        scheduler = ex._scheduler

        async def settle():
            while ex.pending:
                await asyncio.sleep(0.005)
            await asyncio.sleep(4 * scheduler.delay)  # nothing else may still be queued

        async def scenario():
            runs = scheduler.runs
            burst1 = np.geomspace(0.05, 2.0, 25)
            for beta in burst1:
                ex.sliders["beta"].value = float(beta)
            ex.sliders["epsilon"].value = 0.31
            assert ex.pending and computed == [], "a slider change computed synchronously inside the loop"
            await settle()
            assert scheduler.runs == runs + 1, f"{scheduler.runs - runs} updates ran for one burst"
            assert computed == [dict(LESSON, beta=float(burst1[-1]), epsilon=0.31)]
            # A second burst after the first update: again exactly one run, with its last value.
            for beta in (0.4, 0.5, 0.6, 0.7):
                ex.boxes["beta"].value = str(beta)
            await settle()
            assert scheduler.runs == runs + 2
            assert computed[1:] == [dict(LESSON, beta=0.7, epsilon=0.31)]

        asyncio.run(scenario())
    finally:
        del ex.compute
    assert ex.params == dict(LESSON, beta=0.7, epsilon=0.31)
    assert_matches_library(ex, rewards)


def test_latest_wins_scheduler_without_loop_runs_at_once():
    calls = []
    scheduler = explorer_mod.LatestWins(lambda: calls.append(1), delay=10.0)
    scheduler.request()
    scheduler.request()
    assert calls == [1, 1] and not scheduler.pending


def test_show_displays_the_widget_once(ex, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    assert ex.show() is None
    assert shown == [ex.widget]
    classes = set(ex.widget._dom_classes)
    assert "ppo-explorer" in classes
    for name in explorer_mod.SPECS:
        css = name.replace("_", "-")
        assert f"ppo-{css}-slider" in ex.sliders[name]._dom_classes
        assert ex.sliders[name].readout is False, "a slider readout would clamp typed values silently"


def test_explorer_notebook_is_an_ungraded_nbgrader_source_using_the_documented_call():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    first = "".join(code[0]["source"])
    assert "from rlhf_lab.explorer import PPOExplorer" in first and ".show()" in first
    assert "from rlhf_lab.explorer import PPOExplorer" in explorer_mod.__doc__
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        assert not meta.get("grade") and not meta.get("solution"), "the explorer notebook has no graded cells"
        assert not cell.get("outputs"), "source notebooks are committed without outputs"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
