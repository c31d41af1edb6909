"""A live explorer for sequence-level PPO: beta and epsilon sliders, exact curves, likely responses.

    from rlhf_lab.sequences.explorer import SequenceExplorer
    SequenceExplorer().show()

Moving a slider re-runs the whole compiled PPO run of :func:`rlhf_lab.sequences.train` with the new
beta / epsilon (traced values: the program is compiled once, never again for a slider move) and
redraws: exact gold and proxy reward over training, exact sequence KL to the reference (nats) beside
the KL of the optimum ``pi*_beta``, and, for the chosen prompt, the most likely responses under the
trained policy, the reference and ``pi*_beta`` with their probabilities. As in
:mod:`rlhf_lab.explorer`, the figure is a matplotlib ``Figure`` on an Agg canvas rendered to PNG
bytes for an ``ipywidgets.Image`` (no pyplot state), so it works headless and in JupyterLab; slider
values are validated with the library's checks and typed values are never silently clamped.
``explorer.last_summary`` holds the numbers on screen.
"""
from __future__ import annotations

import html
import io
from dataclasses import replace

import numpy as np

from .. import checks
from ..trainer import TRACE_COUNTS
from . import exact
from .ppo import SeqPPOConfig, train
from .task import Task, default_task, optimum_summary

BETA_RANGE = (0.01, 3.0)
EPSILON_RANGE = (0.02, 0.6)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi)
    return buf.getvalue()


class SequenceExplorer:
    """Sliders for beta and epsilon over one task; see the module docstring."""

    def __init__(self, task: Task | None = None, config: SeqPPOConfig = SeqPPOConfig(), prompt: int = 0,
                 top_k: int = 5):
        if task is None:
            task = default_task()
        if not isinstance(task, Task):
            raise ValueError(f"task must be a rlhf_lab.sequences.Task, got {type(task).__name__}")
        if not isinstance(config, SeqPPOConfig):
            raise ValueError(f"config must be a SeqPPOConfig, got {type(config).__name__}")
        self.task = task
        self.config = config
        self.prompt = self._check_prompt(prompt)
        self.top_k = checks.positive_int("top_k", top_k)
        self.last_summary: dict = {}
        self._widgets = None
        self._fig = None
        self.runs = 0
        self._update()

    # -- values -----------------------------------------------------------------------------

    def _check_prompt(self, prompt) -> int:
        prompt = checks.positive_int("prompt", prompt, minimum=0)
        if prompt >= self.task.lang.n_prompts:
            raise ValueError(f"prompt must be in [0, {self.task.lang.n_prompts - 1}], got {prompt}")
        return prompt

    @staticmethod
    def _check_range(name, value, bounds):
        if not bounds[0] <= value <= bounds[1]:
            raise ValueError(f"{name} = {value:.6g} is outside this explorer's range [{bounds[0]}, {bounds[1]}]")
        return value

    def set(self, beta=None, epsilon=None, prompt=None) -> dict:
        """Validate and apply new values (any subset), re-run once, redraw; returns :attr:`last_summary`."""
        changes = {}
        if beta is not None:
            changes["beta"] = self._check_range("beta", checks.beta(beta), BETA_RANGE)
        if epsilon is not None:
            changes["epsilon"] = self._check_range("epsilon", checks.epsilon(epsilon), EPSILON_RANGE)
        if prompt is not None:
            self.prompt = self._check_prompt(prompt)
        if changes:
            self.config = replace(self.config, **changes)
        self._update(rerun=bool(changes) or not self.last_summary)
        return self.last_summary

    # -- computation --------------------------------------------------------------------------

    def _update(self, rerun: bool = True) -> None:
        cfg, task = self.config, self.task
        if rerun or not hasattr(self, "_result"):
            self._result = train(task, cfg)
            self.runs += 1
            a = task.arrays
            _, self._resp = exact.policy_tables(self._result.policy_params, a.prefix_features, task.lang)
            self._opt_resp = exact.optimal_logp(a.ref_resp_logp, a.score, cfg.beta)
            self._opt = optimum_summary(task, cfg.beta)
        r = self._result
        top = {name: task.top_responses(logp, self.prompt, self.top_k)
               for name, logp in (("trained", self._resp), ("reference", task.arrays.ref_resp_logp),
                                  ("optimum", self._opt_resp))}
        self.last_summary = {
            "beta": cfg.beta, "epsilon": cfg.epsilon, "prompt": self.prompt,
            "iterations": np.asarray(r.eval_iteration), "gold": np.asarray(r.gold), "proxy": np.asarray(r.proxy),
            "kl": np.asarray(r.kl), "regret": np.asarray(r.regret),
            "final_gold": float(r.gold[-1]), "final_proxy": float(r.proxy[-1]), "final_kl": float(r.kl[-1]),
            "final_regret": float(r.regret[-1]), "optimum": self._opt, "top": top,
            "traces": TRACE_COUNTS["seq_train"],
        }
        if self._widgets is not None:
            self._render()

    # -- drawing ------------------------------------------------------------------------------

    def figure_png(self) -> bytes:
        """PNG bytes of the current two-panel figure (reward curves, KL curve)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        s = self.last_summary
        if self._fig is None:
            self._fig = Figure(figsize=(9.0, 3.2), dpi=90, layout="constrained")
            FigureCanvasAgg(self._fig)
        fig = self._fig
        fig.clear()
        ax1, ax2 = fig.subplots(1, 2)
        it = s["iterations"]
        ax1.plot(it, s["gold"], color="#d62728", label="gold (hidden)")
        ax1.plot(it, s["proxy"], color="#1f77b4", label="proxy (optimised)")
        ax1.axhline(s["optimum"]["gold"], color="#d62728", ls=":", lw=1, label="gold of π*_β")
        ax1.set_xlabel("PPO iteration")
        ax1.set_ylabel("exact expected reward (reward units)")
        ax1.legend(fontsize=7, loc="best")
        ax2.plot(it, s["kl"], color="#2ca02c", label="KL(π ‖ π_ref)")
        ax2.axhline(s["optimum"]["kl"], color="#2ca02c", ls=":", lw=1, label="KL of π*_β")
        ax2.set_xlabel("PPO iteration")
        ax2.set_ylabel("sequence KL (nats)")
        ax2.legend(fontsize=7, loc="best")
        fig.suptitle(f"β = {s['beta']:.3g}, ε = {s['epsilon']:.3g}", fontsize=9)
        return _png(fig)

    def responses_html(self) -> str:
        """HTML table of the most likely responses of the chosen prompt (trained, reference, optimum)."""
        s = self.last_summary
        head = "".join(f"<th>{html.escape(n)}</th>" for n in ("trained π", "reference π_ref", "optimum π*_β"))
        rows = []
        for i in range(self.top_k):
            cells = []
            for name in ("trained", "reference", "optimum"):
                text, p = s["top"][name][i]
                cells.append(f"<td><code>{html.escape(text)}</code> {p:.3f}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
        return (f"<div class='seq-top'><b>prompt {s['prompt']}: most likely responses (probability)</b>"
                f"<table><tr>{head}</tr>{''.join(rows)}</table></div>")

    def readout_html(self) -> str:
        s = self.last_summary
        return (f"<div class='seq-readout' data-beta='{s['beta']!r}' data-epsilon='{s['epsilon']!r}' "
                f"data-final-gold='{s['final_gold']!r}' data-final-kl='{s['final_kl']!r}'>"
                f"final gold {s['final_gold']:.3f} (π*_β: {s['optimum']['gold']:.3f}), proxy {s['final_proxy']:.3f}, "
                f"KL {s['final_kl']:.2f} nats (π*_β: {s['optimum']['kl']:.2f}), regret {s['final_regret']:.4f}</div>")

    def _render(self) -> None:
        w = self._widgets
        w["image"].value = self.figure_png()
        w["readout"].value = self.readout_html()
        w["top"].value = self.responses_html()

    def widget(self):
        """Build (once) and return the ipywidgets box."""
        if self._widgets is None:
            import ipywidgets as W

            beta = W.FloatLogSlider(value=self.config.beta, base=10, min=np.log10(BETA_RANGE[0]),
                                    max=np.log10(BETA_RANGE[1]), step=0.05, description="β (KL coef.)",
                                    continuous_update=False)
            eps = W.FloatSlider(value=self.config.epsilon, min=EPSILON_RANGE[0], max=EPSILON_RANGE[1], step=0.01,
                                description="ε (clip)", continuous_update=False)
            prompt = W.Dropdown(options=list(range(self.task.lang.n_prompts)), value=self.prompt, description="prompt")
            error = W.HTML("")
            self._widgets = {"beta": beta, "epsilon": eps, "prompt": prompt, "error": error,
                             "image": W.Image(format="png"), "readout": W.HTML(), "top": W.HTML()}

            def on_change(name):
                def handler(change):
                    try:
                        self.set(**{name: change["new"]})
                        error.value = ""
                    except ValueError as exc:
                        error.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
                return handler

            beta.observe(on_change("beta"), names="value")
            eps.observe(on_change("epsilon"), names="value")
            prompt.observe(on_change("prompt"), names="value")
            for name in ("beta", "epsilon", "prompt", "readout", "image", "top"):
                self._widgets[name].add_class(f"seq-{name}")
            self._render()
            self._box = W.VBox([W.HBox([beta, eps, prompt]), error, self._widgets["readout"],
                                self._widgets["image"], self._widgets["top"]])
        return self._box

    def show(self):
        """Display the explorer in the notebook (returns the widget box)."""
        from IPython.display import display

        box = self.widget()
        display(box)
        return box
