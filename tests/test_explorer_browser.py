"""The PPO explorer in a real JupyterLab, driven by headless Chromium with the keyboard.

Starts ``jupyter lab`` (from this virtual environment) on 127.0.0.1 with a random free port and a
random token, serving a temporary copy of ``source/a2c_ppo_explorer/explorer.ipynb``; opens it in the
system Chromium through Playwright (never a downloaded browser), runs all cells from the Run menu,
waits for the widgets, then moves the beta slider and afterwards the epsilon slider with the arrow
keys. After each move the readout's numbers must change and equal what ``rlhf_lab`` computes, in
this test process, for the value the slider now holds; the picture on screen must change and be
the one the kernel rendered for those numbers (SHA-256 of the displayed image bytes); the map's
ring must move without the map being recomputed. Finally an out-of-range typed value must be
refused with a visible message. Screenshots of every state go to ``artifacts/browser/``.

Run alone with ``pytest -m browser``. Skips only when Chromium is not installed.
"""
from __future__ import annotations

import math
import shutil
import threading
import time

import numpy as np
import pytest
from browser_support import ARTIFACTS, REPO, chromium_page, jupyter_lab, require_chromium, run_all_cells

from rlhf_lab.explorer import SPECS
from rlhf_lab.lesson import RECORDED, summarise
from rlhf_lab.trainer import PPOConfig, lesson_rewards, train

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(420)]

NOTEBOOK = REPO / "source" / "a2c_ppo_explorer" / "explorer.ipynb"
LESSON = dict(beta=0.2, epsilon=0.2, learning_rate=0.15, epochs=3, batch_size=128, iterations=40, seed=11)
PARAM_ATTRS = {  # readout data-* attribute (camelCase in dataset) -> PPOConfig field, type
    "beta": ("beta", float), "epsilon": ("epsilon", float), "learningRate": ("learning_rate", float),
    "epochs": ("epochs", int), "batchSize": ("batch_size", int), "iterations": ("iterations", int),
    "seed": ("seed", int),
}

READOUT_JS = "() => { const el = document.querySelector('.ppo-readout-line'); return el ? Object.assign({}, el.dataset) : null; }"
MAP_JS = "() => { const el = document.querySelector('.ppo-map-ready'); return el ? Object.assign({}, el.dataset) : null; }"
# SHA-256 of the bytes the <img> is showing (fetched from its blob URL inside the page).
IMG_SHA_JS = """async (selector) => {
    const img = document.querySelector(selector);
    if (!img || !img.src) return null;
    try {
        const buf = await (await fetch(img.src)).arrayBuffer();
        const digest = await crypto.subtle.digest('SHA-256', buf);
        return Array.from(new Uint8Array(digest)).map(b => b.toString(16).padStart(2, '0')).join('');
    } catch (e) { return null; }  // the image was replaced while we read it: ask again
}"""


def _readout(page) -> dict:
    return page.evaluate(READOUT_JS)


def _params(readout: dict) -> dict:
    return {field: cast(readout[attr]) for attr, (field, cast) in PARAM_ATTRS.items()}


def _library_numbers(params: dict, rewards) -> dict:
    """The expected readout for these values, computed here with the library (not the kernel)."""
    config = PPOConfig(**params)
    result = train(config, rewards)
    out = summarise(result, rewards, config.beta)
    out["clip_fraction"] = float(np.asarray(result.clip_frac)[-1])
    out["gap"] = out["objective_optimum"] - out["objective_trained"]
    return out


def _assert_readout_matches_library(readout: dict, rewards) -> dict:
    want = _library_numbers(_params(readout), rewards)
    for attr, key in (("finalReward", "final_reward"), ("finalKl", "final_kl"),
                      ("objectiveTrained", "objective_trained"), ("objectiveOptimum", "objective_optimum"),
                      ("gap", "gap"), ("clipFraction", "clip_fraction"), ("initialReward", "initial_reward")):
        got = float(readout[attr])
        assert math.isclose(got, want[key], rel_tol=2e-6, abs_tol=2e-6), (
            f"readout {attr} = {got} but rlhf_lab gives {want[key]} for {_params(readout)}"
        )
    return want


def _wait_for_settled(page, name: str, expected: float, previous_update: str, timeout_s: float = 90.0) -> dict:
    """Wait until the readout shows a run for ``name`` == ``expected`` and the image on screen is its picture."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = _readout(page)
        if last and last["update"] != previous_update and math.isclose(float(last[name]), expected, rel_tol=1e-9):
            shown = page.evaluate(IMG_SHA_JS, ".ppo-plot")
            if shown == last["plotSha256"]:
                return last
        page.wait_for_timeout(100)
    raise AssertionError(f"readout never settled on {name} = {expected}; last readout: {last}")


def _shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"explorer-{name}.png"), full_page=True)


def _step(page, slider_class: str, key: str, name: str, values: list, previous_update: str) -> dict:
    """Press ``key`` on the slider's handle once per value of ``values``, each time waiting until the
    readout has settled on that value (as a person does: press, look). A change re-renders the widget,
    which can take the focus away: a press sent before that went nowhere, and the run settled one step
    short. Returns the last settled readout."""
    handle = page.locator(f".{slider_class} .noUi-handle").first
    settled = None
    for value in values:
        handle.scroll_into_view_if_needed()
        handle.focus()
        page.keyboard.press(key)
        settled = _wait_for_settled(page, name, value, previous_update)
        previous_update = settled["update"]
    return settled


def _drive(page, server, rewards) -> None:
    page.set_default_timeout(120_000)
    page.goto(server.notebook_url("explorer.ipynb"))
    page.wait_for_selector(".jp-Notebook .jp-Cell")
    run_all_cells(page, server)
    page.wait_for_selector(".ppo-readout-line", timeout=180_000)
    page.wait_for_selector(".ppo-map-ready", timeout=180_000)

    # Initial state: the lesson's configuration reproduces the recorded run.
    before = _readout(page)
    assert _params(before) == LESSON, before
    assert abs(float(before["finalReward"]) - RECORDED["final_reward"]) < 1e-5
    assert abs(float(before["finalKl"]) - RECORDED["final_kl"]) < 1e-5
    _assert_readout_matches_library(before, rewards)
    map_before = page.evaluate(MAP_JS)
    plot_shot_before = page.locator(".ppo-plot").screenshot()
    _shot(page, "1-initial")

    # beta: two steps right on the log slider (step 0.05 in log10 beta, from its snapped
    # start position round(log10(0.2) / 0.05) * 0.05).
    spec = SPECS["beta"]
    start = round(math.log10(0.2) / spec.step) * spec.step
    expected_beta = 10 ** (start + 2 * spec.step)
    after_beta = _step(page, "ppo-beta-slider", "ArrowRight", "beta",
                       [10 ** (start + spec.step), expected_beta], before["update"])
    assert float(after_beta["beta"]) > float(before["beta"])
    assert _params(after_beta) == dict(_params(before), beta=float(after_beta["beta"]))
    assert after_beta["finalReward"] != before["finalReward"] and after_beta["finalKl"] != before["finalKl"]
    _assert_readout_matches_library(after_beta, rewards)
    assert after_beta["plotSha256"] != before["plotSha256"], "the figure did not change"
    plot_shot_beta = page.locator(".ppo-plot").screenshot()
    assert plot_shot_beta != plot_shot_before, "the rendered plot looks the same"
    page.wait_for_function(
        f"() => {{ const m = document.querySelector('.ppo-map-ready');"
        f" return m && m.dataset.markerBeta === '{after_beta['beta']}'; }}"
    )
    map_beta = page.evaluate(MAP_JS)
    assert map_beta["gridComputes"] == map_before["gridComputes"], "moving beta recomputed the map"
    assert map_beta["mapSha256"] != map_before["mapSha256"], "the map's ring did not move"
    assert page.evaluate(IMG_SHA_JS, ".ppo-map") == map_beta["mapSha256"]
    _shot(page, "2-after-beta")

    # epsilon: three steps left on the linear slider (step 0.01).
    after_eps = _step(page, "ppo-epsilon-slider", "ArrowLeft", "epsilon",
                      [0.2 - k * SPECS["epsilon"].step for k in (1, 2, 3)], after_beta["update"])
    assert math.isclose(float(after_eps["epsilon"]), 0.17, rel_tol=1e-9), after_eps
    assert float(after_eps["epsilon"]) < float(after_beta["epsilon"])
    assert _params(after_eps) == dict(_params(after_beta), epsilon=float(after_eps["epsilon"]))
    assert after_eps["finalReward"] != after_beta["finalReward"]
    _assert_readout_matches_library(after_eps, rewards)
    assert after_eps["plotSha256"] != after_beta["plotSha256"], "the figure did not change"
    assert page.locator(".ppo-plot").screenshot() != plot_shot_beta, "the rendered plot looks the same"
    page.wait_for_function(
        f"() => {{ const m = document.querySelector('.ppo-map-ready');"
        f" return m && m.dataset.markerEpsilon === '{after_eps['epsilon']}'; }}"
    )
    assert page.evaluate(MAP_JS)["gridComputes"] == map_before["gridComputes"]
    _shot(page, "3-after-epsilon")

    # A typed out-of-range value is refused with a visible message; nothing is recomputed.
    box = page.locator(".ppo-beta-box input").first
    box.fill("-1")
    box.press("Enter")
    message = page.locator(".ppo-error-message")
    message.wait_for(state="visible")
    assert "beta" in message.inner_text() and "must be > 0" in message.inner_text()
    page.wait_for_function(
        "(v) => document.querySelector('.ppo-beta-box input').value === v",
        arg=f"{float(after_eps['beta']):.6g}",
    )
    assert _readout(page)["update"] == after_eps["update"]
    _shot(page, "4-rejected-typed-value")


def test_explorer_sliders_in_jupyterlab(tmp_path):
    require_chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    root = tmp_path / "course"
    root.mkdir()
    shutil.copy(NOTEBOOK, root / "explorer.ipynb")
    rewards = lesson_rewards()
    # Compile the library's trainer in this process while JupyterLab starts (it is what the
    # readout is checked against); the browser also starts while the server is coming up.
    warm = threading.Thread(target=_library_numbers, args=(LESSON, rewards), daemon=True)
    warm.start()
    # Both context managers stop their process (server and kernels, browser) even on failure.
    with jupyter_lab(root, tmp_path / "lab-state", wait=False) as server, chromium_page() as page:
        try:
            server.wait_ready()
            warm.join()
            _drive(page, server, rewards)
        except BaseException:
            try:
                _shot(page, "failure")
            except Exception:  # the page may be unusable by now
                pass
            print("---- jupyter lab log (tail) ----")
            print(server.log_tail(80))
            raise
