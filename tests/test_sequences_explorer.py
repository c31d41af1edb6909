"""The sequence explorer: a slider move re-runs the compiled PPO run without recompiling and shows
the same numbers as sq.train; bad values are rejected with the library's messages."""
import numpy as np
import pytest

from rlhf_lab import sequences as sq
from rlhf_lab.sequences.explorer import SequenceExplorer


@pytest.fixture(scope="module")
def explorer():
    return SequenceExplorer()  # default task and configuration (shares the compiled program)


def test_numbers_match_a_direct_run(explorer):
    s = explorer.set(beta=0.3, epsilon=0.1)
    direct = sq.train(sq.default_task(), sq.SeqPPOConfig(beta=0.3, epsilon=0.1))
    np.testing.assert_array_equal(s["gold"], np.asarray(direct.gold))
    np.testing.assert_array_equal(s["kl"], np.asarray(direct.kl))
    assert s["optimum"]["kl"] == pytest.approx(sq.optimum_summary(sq.default_task(), 0.3)["kl"])


def test_slider_moves_do_not_recompile(explorer):
    explorer.set(beta=0.05)
    traces = explorer.last_summary["traces"]
    explorer.set(beta=1.0)
    explorer.set(epsilon=0.3)
    assert explorer.last_summary["traces"] == traces
    assert explorer.last_summary["final_kl"] < 1.5  # large beta stays near the reference


def test_widget_renders_and_updates(explorer):
    box = explorer.widget()
    assert box is explorer.widget()
    png = explorer._widgets["image"].value
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    runs = explorer.runs
    explorer._widgets["beta"].value = 0.2
    assert explorer.runs == runs + 1 and explorer.last_summary["beta"] == pytest.approx(0.2)
    assert "prompt 0" in explorer._widgets["top"].value
    explorer._widgets["prompt"].value = 2  # a new prompt redraws without re-running
    assert explorer.runs == runs + 1 and "prompt 2" in explorer._widgets["top"].value


def test_top_responses_are_probabilities(explorer):
    for name, rows in explorer.last_summary["top"].items():
        probs = [p for _, p in rows]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6, name


@pytest.mark.parametrize("kw, match", [
    (dict(beta=0.0), "beta .KL coefficient. must be > 0"),
    (dict(beta=50.0), "outside this explorer's range"),
    (dict(epsilon=1.2), "clip range"),
    (dict(prompt=9), r"prompt must be in \[0, 3\]"),
])
def test_bad_values(explorer, kw, match):
    with pytest.raises(ValueError, match=match):
        explorer.set(**kw)
