"""Benchmark of the live PPO explorer: slider value -> new numbers, and -> redrawn figure.

Runs in one process on the CPU, with the explorer in synchronous mode (no event loop, so each
slider assignment triggers its update immediately). For many beta and epsilon slider values it
times:

* value change -> new numbers: assigning the slider's ``value`` (what the front end's message
  does: observer, scheduler, compiled trainer ``make_train(*shape)``, jitted headline numbers as
  Python floats) with the drawing switched off; and ``PPOExplorer.compute(params)`` alone;
* compute + redraw: assigning the slider's ``value`` (what the front end does), i.e. observer,
  compute, in-place artist updates, blitted Agg render of both figures to PNG and the widget
  updates (``Image`` bytes, readout HTML);
* for comparison, a full redraw of both figures (no cached background), as a figure that redraws
  everything on each change would pay.

Targets on the 2-core course machine: compute < 5 ms median after the first compile; compute +
redraw < 150 ms median. The script also checks that none of these value changes traced (compiled)
anything, and records the machine load, because the machine is shared.

Usage: ``python bench/bench_explorer.py [--values N] [--out bench/results/explorer.md]``
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _median_ms(xs):
    return 1e3 * statistics.median(xs)


def _pct_ms(xs, q):
    xs = sorted(xs)
    return 1e3 * xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=60, help="slider values per parameter (default 60)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved measurement rounds (default 5)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "explorer.md"))
    args = parser.parse_args(argv)

    import jax
    import numpy as np

    from rlhf_lab import explorer as ex_mod
    from rlhf_lab.trainer import TRACE_COUNTS

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    ex = ex_mod.PPOExplorer()
    first_build = time.perf_counter() - t0  # includes the first compiles (trainer, summary, map)

    rng = np.random.default_rng(0)
    betas = np.exp(rng.uniform(np.log(0.02), np.log(5.0), args.values))
    epsilons = rng.uniform(0.03, 0.9, args.values)
    base = ex.current_params()

    # Warm-up (caches, allocator), not timed.
    for v in (0.3, 0.4):
        ex.compute({**base, "beta": v})
    traces_before = dict(TRACE_COUNTS)

    draw_run, draw_map = ex._draw_run, ex._draw_map

    def numbers_only(params, summary):
        ex.params, ex.last_summary = params, summary

    def chunks(values):
        return np.array_split(np.asarray(values), args.rounds)

    # The three measures run in interleaved rounds (each round: a slice of the beta values, then of
    # the epsilon values, for each measure), so a burst of load from other jobs on this shared
    # machine hits all of them alike; each round's median is reported as well as the overall one.
    compute_s, numbers_s, end_to_end_s, split = [], [], [], []
    rounds = []
    for r_betas, r_eps in zip(chunks(betas), chunks(epsilons)):
        c0, n0, e0 = len(compute_s), len(numbers_s), len(end_to_end_s)
        load = os.getloadavg()[0]
        # 1. compute() alone.
        for name, values in (("beta", r_betas), ("epsilon", r_eps)):
            for v in values:
                params = {**base, name: float(v)}
                t = time.perf_counter()
                ex.compute(params)
                compute_s.append(time.perf_counter() - t)
        # 2. value change -> new numbers through the real path (slider observer, scheduler,
        #    compute) with the drawing switched off for this measurement only.
        ex._draw_run, ex._draw_map = numbers_only, lambda: None
        try:
            for name, values in (("beta", r_betas), ("epsilon", r_eps)):
                for v in values:
                    t = time.perf_counter()
                    ex.sliders[name].value = float(v)
                    numbers_s.append(time.perf_counter() - t)
                    assert ex.last_summary["params"][name] == float(v)
                ex.set(**{name: base[name]})
        finally:
            ex._draw_run, ex._draw_map = draw_run, draw_map
            ex.params = None
            ex.refresh()
        # 3. value change -> new numbers + redrawn figures (the whole update).
        for name, values in (("beta", r_betas), ("epsilon", r_eps)):
            for v in values:
                n = ex.stats["computes"]
                t = time.perf_counter()
                ex.sliders[name].value = float(v)  # observer -> (sync) update -> compute + draw
                end_to_end_s.append(time.perf_counter() - t)
                assert ex.stats["computes"] == n + 1, "each value change must give exactly one update"
                split.append(ex.timings[-1])
            ex.set(**{name: base[name]})
        rounds.append((load, _median_ms(numbers_s[n0:]), _median_ms(compute_s[c0:]), _median_ms(end_to_end_s[e0:])))

    full_redraw_s = []
    for _ in range(min(20, args.values)):
        ex._panels.blit.invalidate()
        ex._map.blit.invalidate()
        t = time.perf_counter()
        ex._panels.render()
        ex._map.render()
        full_redraw_s.append(time.perf_counter() - t)

    traces_after = dict(TRACE_COUNTS)
    load_after = os.getloadavg()
    new_traces = {k: traces_after.get(k, 0) - traces_before.get(k, 0) for k in traces_after}
    assert not any(new_traces.values()), f"moving beta/epsilon traced again: {new_traces}"

    med_compute = _median_ms(compute_s)
    med_numbers = _median_ms(numbers_s)
    med_e2e = _median_ms(end_to_end_s)
    med_inner_compute = _median_ms([c for c, _ in split])
    med_inner_draw = _median_ms([d for _, d in split])
    med_full = _median_ms(full_redraw_s)
    ok_compute = med_numbers < 5.0
    ok_e2e = med_e2e < 150.0

    lines = [
        "# Live PPO explorer: slider change -> numbers -> figure",
        "",
        f"Produced by `bench/bench_explorer.py` ({2 * args.values} slider values: {args.values} for β "
        f"log-uniform in [0.02, 5], {args.values} for ε uniform in [0.03, 0.9]; lesson shape 40 rollouts × 128 "
        "samples × 3 inner epochs; one process, CPU, explorer in synchronous mode).",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"jax {jax.__version__}. Load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} "
        "(the machine is shared; other jobs inflate these times).",
        "",
        "| measure | median | 90th pct | target | met |",
        "|---|---|---|---|---|",
        f"| value change → new numbers (slider observer + compiled trainer + headline numbers; no drawing) | {med_numbers:.2f} ms | {_pct_ms(numbers_s, 0.9):.2f} ms | < 5 ms | {'yes' if ok_compute else 'NO'} |",
        f"| `compute()` alone (same work without the widget layer) | {med_compute:.2f} ms | {_pct_ms(compute_s, 0.9):.2f} ms | | |",
        f"| value change → new numbers + redrawn figures (end to end) | {med_e2e:.1f} ms | {_pct_ms(end_to_end_s, 0.9):.1f} ms | < 150 ms | {'yes' if ok_e2e else 'NO'} |",
        f"| … of which compute (slower than above: the redraw before it evicts the CPU caches) | {med_inner_compute:.2f} ms | | | |",
        f"| … of which redraw (artist updates, blitted render of both figures to PNG, widget updates) | {med_inner_draw:.1f} ms | | | |",
        f"| for comparison: full redraw of both figures (no cached background) | {med_full:.1f} ms | {_pct_ms(full_redraw_s, 0.9):.1f} ms | | |",
        "",
        "Per round (interleaved; load average at the start of the round):",
        "",
        "| round | load | value change → numbers | `compute()` | value change → numbers + figures |",
        "|---|---|---|---|---|",
        *[f"| {i + 1} | {load:.1f} | {a:.2f} ms | {b:.2f} ms | {c:.1f} ms |" for i, (load, a, b, c) in enumerate(rounds)],
        "",
        f"First construction (reward fit, first compiles of trainer, summary and the 16×16 map, first "
        f"render): {first_build:.1f} s. New traces during the {len(compute_s) + len(numbers_s) + len(end_to_end_s)} timed β/ε changes: "
        f"{sum(new_traces.values())} (trace counters {traces_after}).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"written to {out}")
    return 0 if (ok_compute and ok_e2e) else 1


if __name__ == "__main__":
    sys.exit(main())
