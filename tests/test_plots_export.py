"""The 3-panel figure (data, units, in-place updates, headless backend) and the data export,
plus the headless lesson command."""
import csv
import dataclasses
import datetime as dt
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlhf_lab import lesson, lesson_cli, plots, trainer

ROOT = Path(__file__).resolve().parent.parent
LESSON_REWARDS = np.array([1.9811294, 0.327278, -2.3084073])


def _np_optimum(ref_logp, rewards, beta):
    """Independent float64 optimum pi* = pi_ref exp(r/beta) / Z."""
    z = np.asarray(ref_logp, np.float64) + np.asarray(rewards, np.float64) / beta
    w = np.exp(z - z.max())
    return w / w.sum()


@pytest.fixture(scope="module")
def lesson_run():
    config = trainer.PPOConfig()
    result, summary = lesson.run_lesson(config)
    return config, result, summary, np.asarray(trainer.lesson_rewards())


@pytest.fixture(scope="module")
def other_run():
    """A second run with a different shape and beta, for in-place updates."""
    # same loop sizes as tests/test_trainer.py's small runs, so one compiled program serves both
    config = trainer.PPOConfig(iterations=6, batch_size=24, epochs=2, beta=0.8, epsilon=0.1, seed=4)
    return config, trainer.train(config)


@pytest.fixture
def figure(lesson_run):
    config, result, _, rewards = lesson_run
    return plots.three_panel_figure(result, rewards, config.beta)


def test_three_panels_with_units_and_titles(figure):
    axes = figure.get_axes()
    assert len(axes) == 3
    ax_r, ax_k, ax_p = figure.rlhf_panels.ax_reward, figure.rlhf_panels.ax_kl, figure.rlhf_panels.ax_probs
    assert list(axes) == [ax_r, ax_k, ax_p]
    assert ax_r.get_ylabel() == "expected learned reward (reward-model score units)"
    assert "nats" in ax_k.get_ylabel() and "KL" in ax_k.get_ylabel()
    assert ax_p.get_ylabel() == "probability"
    for ax in axes:
        assert ax.get_xlabel(), "every axis needs a label"
        assert ax.get_title(), "every panel needs a title"
    assert "rollout" in ax_r.get_xlabel() and "rollout" in ax_k.get_xlabel()
    # no panel mixes quantities: the reward and KL curves live on different axes
    assert figure.rlhf_panels.reward_line.axes is ax_r and figure.rlhf_panels.kl_line.axes is ax_k


def test_panels_show_the_run(figure, lesson_run):
    config, result, summary, rewards = lesson_run
    art = figure.rlhf_panels
    x, y = art.reward_line.get_data()
    np.testing.assert_array_equal(x, np.arange(41))
    assert y[0] == pytest.approx(0.28191882, abs=1e-6)  # index 0 is the reference policy
    np.testing.assert_allclose(y[1:], np.asarray(result.reward), rtol=0, atol=1e-7)
    assert y[-1] == pytest.approx(1.9185448, abs=1e-5)
    x, y = art.kl_line.get_data()
    assert y[0] == 0.0
    np.testing.assert_allclose(y[1:], np.asarray(result.kl), atol=1e-7)
    assert y[-1] == pytest.approx(0.7824773, abs=1e-5)
    ref_p = np.exp(np.asarray(result.ref_logp, np.float64))
    np.testing.assert_allclose([b.get_height() for b in art.ref_bars], ref_p, atol=1e-7)
    np.testing.assert_allclose([b.get_height() for b in art.final_bars], np.asarray(result.probs[-1]), atol=1e-7)
    opt = _np_optimum(np.asarray(result.ref_logp), LESSON_REWARDS, 0.2)
    np.testing.assert_allclose(art.opt_markers.get_ydata(), opt, atol=1e-6)
    assert art.opt_markers.get_label() and "optimum" in art.opt_markers.get_label()
    # the optimum's expected reward and KL are marked in their own panels, in their own units
    assert art.reward_opt_line.get_ydata()[0] == pytest.approx(float(opt @ LESSON_REWARDS), abs=1e-5)
    opt_kl = float(np.sum(opt * (np.log(opt) - np.asarray(result.ref_logp, np.float64))))
    assert art.kl_opt_line.get_ydata()[0] == pytest.approx(opt_kl, abs=1e-5)


def test_explicit_optimum_probs_are_used(lesson_run):
    config, result, _, rewards = lesson_run
    fig = plots.three_panel_figure(result, rewards, config.beta, optimum_probs=[0.5, 0.3, 0.2])
    np.testing.assert_allclose(fig.rlhf_panels.opt_markers.get_ydata(), [0.5, 0.3, 0.2])


def test_update_changes_artists_in_place(figure, other_run, lesson_run, monkeypatch):
    import matplotlib.figure

    art = figure.rlhf_panels
    lines = (art.reward_line, art.kl_line, art.opt_markers)
    bars = list(art.ref_bars) + list(art.final_bars)
    axes = list(figure.get_axes())
    created = []
    original_init = matplotlib.figure.Figure.__init__

    def spy(self, *a, **k):
        created.append(self)
        original_init(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "__init__", spy)
    config, result = other_run
    _, _, _, rewards = lesson_run
    out = plots.update_three_panel(figure, result, rewards, config.beta)
    assert out is figure and created == [], "update_three_panel must not create a figure"
    assert list(figure.get_axes()) == axes
    assert (art.reward_line, art.kl_line, art.opt_markers) == lines
    assert list(art.ref_bars) + list(art.final_bars) == bars
    x, y = art.reward_line.get_data()
    np.testing.assert_array_equal(x, np.arange(7))
    np.testing.assert_allclose(y[1:], np.asarray(result.reward), atol=1e-7)
    np.testing.assert_allclose(art.kl_line.get_ydata()[1:], np.asarray(result.kl), atol=1e-7)
    np.testing.assert_allclose([b.get_height() for b in art.final_bars], np.asarray(result.probs[-1]), atol=1e-7)
    np.testing.assert_allclose(art.opt_markers.get_ydata(), _np_optimum(np.asarray(result.ref_logp), LESSON_REWARDS, 0.8), atol=1e-6)
    assert art.ax_reward.get_xlim()[1] < 20, "axes must rescale to the new number of rollouts"
    assert "0.8" in art.title.get_text()


class FourActionRun:
    """A hand-made single run with 4 actions and 3 rollouts (plots only read these fields)."""

    reward = np.array([0.1, 0.3, 0.4])
    kl = np.array([0.01, 0.03, 0.05])
    probs = np.array([[0.3, 0.3, 0.2, 0.2], [0.4, 0.3, 0.2, 0.1], [0.5, 0.25, 0.15, 0.1]])
    clip_frac = np.array([0.0, 0.1, 0.2])
    ref_logp = np.log(np.array([0.25, 0.25, 0.25, 0.25]))
    initial_reward = 0.0


def test_update_with_a_different_number_of_actions(figure):
    rewards = [1.0, 0.0, -1.0, 0.5]
    axes = list(figure.get_axes())
    plots.update_three_panel(figure, FourActionRun, rewards, 0.5, redraw=False)
    assert list(figure.get_axes()) == axes
    art = figure.rlhf_panels
    assert len(art.final_bars) == 4 and art.n_actions == 4
    np.testing.assert_allclose([b.get_height() for b in art.final_bars], FourActionRun.probs[-1])
    np.testing.assert_allclose(art.opt_markers.get_ydata(), _np_optimum(FourActionRun.ref_logp, rewards, 0.5), atol=1e-9)


def test_update_rejects_a_foreign_figure():
    from matplotlib.figure import Figure

    with pytest.raises(ValueError, match="three_panel_figure"):
        plots.update_three_panel(Figure(), None, [1.0], 0.2)


def test_savefig_png_headless(figure, tmp_path):
    path = tmp_path / "figure.png"
    figure.savefig(path, dpi=60)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_import_does_not_choose_a_backend_or_import_pyplot(tmp_path):
    code = (
        "import sys, matplotlib\n"
        "import rlhf_lab.plots\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported at import time'\n"
        "assert matplotlib.rcParams._get_backend_or_none() == 'svg', matplotlib.rcParams._get_backend_or_none()\n"
        "import numpy as np, types\n"
        "r = types.SimpleNamespace(reward=np.array([0.5, 0.7]), kl=np.array([0.01, 0.02]),\n"
        "    probs=np.array([[0.5, 0.5], [0.6, 0.4]]), clip_frac=np.zeros(2), ref_logp=np.log([0.5, 0.5]),\n"
        "    initial_reward=0.3)\n"
        "fig = rlhf_lab.plots.three_panel_figure(r, [1.0, -1.0], 0.2)\n"
        "fig.savefig(sys.argv[1])\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported by three_panel_figure'\n"
        "assert matplotlib.rcParams._get_backend_or_none() == 'svg'\n"
        "print('ok')\n"
    )
    env = dict(os.environ, MPLBACKEND="svg", JAX_PLATFORMS="cpu")
    png = tmp_path / "headless.png"
    out = subprocess.run([sys.executable, "-c", code, str(png)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"  # an Agg canvas, although the default backend is svg


# ---------------------------------------------------------------------------------------------
# Export


def _installed(dist):
    return importlib.metadata.version(dist)


def test_export_json_has_data_and_provenance(lesson_run, tmp_path):
    config, result, summary, rewards = lesson_run
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    path = tmp_path / "run.json"
    plots.export_run(path, config, result, summary, rewards=rewards)
    record = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    prov = record["provenance"]
    created = dt.datetime.fromisoformat(prov["created_utc"])
    assert created.utcoffset() == dt.timedelta(0)
    assert before <= created <= dt.datetime.now(dt.timezone.utc)
    assert prov["python"] == platform.python_version()
    assert prov["platform"]
    for dist in ("jax", "jaxlib", "numpy", "matplotlib"):
        assert prov["packages"][dist] == _installed(dist)
    assert prov["packages"]["rlhf_lab"] == _installed("rlhf-lab")
    assert record["config"] == {
        "iterations": 40, "batch_size": 128, "epochs": 3, "beta": 0.2, "epsilon": 0.2,
        "learning_rate": 0.15, "seed": 11, "init_logits": [0.2, 0.0, -0.2],
    }
    series = record["series"]
    assert series["rollout"] == list(range(1, 41))
    np.testing.assert_allclose(series["expected_reward"], np.asarray(result.reward), atol=1e-7)
    np.testing.assert_allclose(series["kl"], np.asarray(result.kl), atol=1e-7)
    np.testing.assert_allclose(series["clip_fraction"], np.asarray(result.clip_frac), atol=1e-7)
    np.testing.assert_allclose(series["probs"], np.asarray(result.probs), atol=1e-7)
    np.testing.assert_allclose(record["final_probs"], np.asarray(result.probs[-1]), atol=1e-7)
    np.testing.assert_allclose(record["optimum_probs"], _np_optimum(np.asarray(result.ref_logp), LESSON_REWARDS, 0.2), atol=1e-6)
    np.testing.assert_allclose(record["rewards"], LESSON_REWARDS, atol=1e-6)
    s = record["summary"]
    assert s["final_reward"] == pytest.approx(1.9185448, abs=1e-5)
    assert s["final_kl"] == pytest.approx(0.7824773, abs=1e-5)
    assert s["objective_optimum"] == pytest.approx(1.7987912, abs=1e-5)
    assert record["units"]["kl"] == "nats"


def test_export_csv_has_series_and_provenance_header(lesson_run, tmp_path):
    config, result, summary, rewards = lesson_run
    path = tmp_path / "run.csv"
    plots.export_run(path, config, result, summary)
    lines = path.read_text().splitlines()
    header = [ln for ln in lines if ln.startswith("#")]
    body = [ln for ln in lines if not ln.startswith("#")]
    assert lines[0].startswith("#") and len(header) >= 5
    text = "\n".join(header)
    assert f"jax=={_installed('jax')}" in text and f"numpy=={_installed('numpy')}" in text
    assert '"seed": 11' in text and "created_utc" in text
    rows = list(csv.DictReader(body))
    assert len(rows) == 40
    assert list(rows[0]) == ["rollout", "expected_reward", "kl_nats", "clip_fraction",
                             "prob_action_0", "prob_action_1", "prob_action_2"]
    np.testing.assert_allclose([float(r["expected_reward"]) for r in rows], np.asarray(result.reward), atol=1e-7)
    np.testing.assert_allclose([float(r["kl_nats"]) for r in rows], np.asarray(result.kl), atol=1e-7)
    assert float(rows[-1]["expected_reward"]) == pytest.approx(1.9185448, abs=1e-5)
    assert [int(r["rollout"]) for r in rows] == list(range(1, 41))


# ---------------------------------------------------------------------------------------------
# The headless lesson command


def test_lesson_cli_prints_the_lesson_numbers_and_writes_its_outputs(tmp_path, capsys):
    assert lesson_cli.main(["--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    # the lesson's numbers, in the lesson's order
    order = ["0.28191882", "1.91854477", "0.78247726", "2.40000", "-1.60000", "enumerated",
             "KL at the reference", "old_logp", "advantages", "1.76204932", "1.79879117", "PASS"]
    positions = [text.find(token) for token in order]
    assert all(p >= 0 for p in positions), dict(zip(order, positions))
    assert positions == sorted(positions), dict(zip(order, positions))
    for name in ("figure.png", "run.json", "run.csv"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert (tmp_path / "out" / "figure.png").read_bytes()[:4] == b"\x89PNG"
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["config"]["seed"] == 11
    assert record["summary"]["final_reward"] == pytest.approx(1.9185448, abs=1e-5)


def test_lesson_cli_fails_when_a_number_is_off(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(lesson_cli.RECORDED, "final_reward", 1.9185448 + 1e-4)
    assert lesson_cli.main(["--out", str(tmp_path)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_format_table_tolerance():
    _, ok = lesson_cli.format_table([("a", 1.0, 1.0 + 5e-6)])
    assert ok
    _, ok = lesson_cli.format_table([("a", 1.0, 1.0 + 2e-5)])
    assert not ok
    _, ok = lesson_cli.format_table([("a", float("nan"), 0.0)])
    assert not ok
