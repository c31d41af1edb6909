"""Benchmark: the lesson's Python-level PPO loop vs the compiled trainer, and a 32x32 beta x epsilon sweep.

Everything runs in ONE process on the lesson configuration (key 11, 40 rollouts x 128 samples,
3 inner steps, lr 0.15, beta 0.2, epsilon 0.2), so the ratio compares like with like on the same
machine state. Writes a markdown table to bench/results/trainer.md.

    PATH=.venv/bin:$PATH JAX_PLATFORMS=cpu .venv/bin/python bench/bench_trainer.py [--repeats N]

Targets from the course issue (reported, never asserted): compiled trainer >= 50x faster than the
seed-style loop; the 1,024-run sweep under 1 s after compilation. A miss prints WARN.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rlhf_lab import lesson, sweep, trainer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "trainer.md"

SPEEDUP_TARGET = 50.0
SWEEP_TARGET_S = 1.0


CPU = {}  # label -> per-call process CPU seconds (all threads), less sensitive to other users' load


def timed(fn, repeats: int, label: str | None = None) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn`` (which must block until its result is ready)."""
    out, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    if label:
        CPU[label] = statistics.median(cpu)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats of the slow loop (default 7)")
    parser.add_argument("--fast-repeats", type=int, default=70, help="timed repeats of the compiled calls (default 70)")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    config = trainer.PPOConfig()
    rewards = trainer.lesson_rewards()

    # --- warm-ups: compile the seed-style step and the compiled trainer before timing anything
    warm = lesson.seed_style_train(config, rewards)
    t0 = time.perf_counter()
    first = jax.block_until_ready(trainer.train(config, rewards))
    train_first = time.perf_counter() - t0

    # --- interleaved timing (slow loop, then a burst of compiled runs, repeated) so both see the
    # same machine load; the seed-style loop makes one jitted value_and_grad call per inner update
    # "compiled" = the jitted program itself on prepared arguments; "train()" adds the public
    # wrapper's validation and argument conversion (what a notebook calls).
    compiled = trainer.make_train(*config.shape)
    prepared = (jax.random.key(config.seed), jnp.asarray(config.init_logits, jnp.float32), rewards,
                jnp.float32(config.beta), jnp.float32(config.epsilon), jnp.float32(config.learning_rate))
    jax.block_until_ready(compiled(*prepared))
    slow, fast, wrapped = [], [], []
    cpus = {"slow": [], "fast": [], "wrapped": []}
    per_round = max(1, args.fast_repeats // args.repeats)
    for _ in range(args.repeats):
        slow += timed(lambda: lesson.seed_style_train(config, rewards), 1, "slow")
        fast += timed(lambda: jax.block_until_ready(compiled(*prepared)), per_round, "fast")
        wrapped += timed(lambda: jax.block_until_ready(trainer.train(config, rewards)), per_round, "wrapped")
        for k in cpus:
            cpus[k].append(CPU[k])
    CPU.update({k: statistics.median(v) for k, v in cpus.items()})
    agree = max(abs(a - float(b)) for a, b in zip(warm["reward"], np.asarray(first.reward)))

    # --- 32 x 32 beta x epsilon sweep (1,024 runs in one compiled call)
    betas = np.geomspace(0.01, 2.0, 32)
    epsilons = np.linspace(0.02, 0.6, 32)
    t0 = time.perf_counter()
    grid = jax.block_until_ready(sweep.sweep_grid(config, betas, epsilons))
    sweep_first = time.perf_counter() - t0
    # time with different values each call: moving beta/epsilon must not recompile
    traces = trainer.TRACE_COUNTS["sweep"]
    sweep_runs = timed(
        lambda: jax.block_until_ready(sweep.sweep_grid(config, betas * 1.001, epsilons * 0.999)), max(3, args.repeats), "sweep"
    )
    recompiled = trainer.TRACE_COUNTS["sweep"] - traces
    load_after = os.getloadavg()

    slow_med = statistics.median(slow)
    fast_med = statistics.median(fast)
    wrapped_med = statistics.median(wrapped)
    sweep_med = statistics.median(sweep_runs)
    ratio = slow_med / fast_med
    sweep_compile = max(sweep_first - sweep_med, 0.0)

    rows = [
        ("seed-style Python loop (1 jitted step per inner update)", f"{slow_med * 1e3:.1f} ms",
         f"median of {len(slow)}; min {min(slow) * 1e3:.1f} ms; CPU {CPU['slow'] * 1e3:.1f} ms"),
        ("compiled trainer (one jitted scan call, prepared arguments)", f"{fast_med * 1e3:.3f} ms",
         f"median of {len(fast)}; min {min(fast) * 1e3:.3f} ms; CPU {CPU['fast'] * 1e3:.3f} ms; "
         f"first call incl. compile {train_first:.2f} s"),
        ("trainer.train() (validation + conversion + compiled call)", f"{wrapped_med * 1e3:.3f} ms",
         f"median of {len(wrapped)}; min {min(wrapped) * 1e3:.3f} ms; CPU {CPU['wrapped'] * 1e3:.3f} ms; "
         f"speed-up vs seed-style {slow_med / wrapped_med:.0f}x"),
        ("speed-up (seed-style / compiled)", f"{ratio:.0f}x",
         f"target >= {SPEEDUP_TARGET:.0f}x; ratio of wall medians (min/min {min(slow) / min(fast):.0f}x, "
         f"CPU/CPU {CPU['slow'] / CPU['fast']:.0f}x)"),
        ("32x32 beta x epsilon sweep, compile (first call - median run)", f"{sweep_compile:.2f} s",
         f"first call {sweep_first:.2f} s"),
        ("32x32 beta x epsilon sweep, run (1,024 runs)", f"{sweep_med * 1e3:.0f} ms",
         f"median of {len(sweep_runs)}; min {min(sweep_runs) * 1e3:.0f} ms; CPU {CPU['sweep'] * 1e3:.0f} ms; "
         f"target < {SWEEP_TARGET_S:.0f} s; re-traces while moving values: {recompiled}"),
    ]
    header = [
        f"# Trainer benchmark ({dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')})",
        "",
        f"Lesson configuration: key {config.seed}, {config.iterations} rollouts x {config.batch_size} samples, "
        f"{config.epochs} inner steps, lr {config.learning_rate}, beta {config.beta}, epsilon {config.epsilon}.",
        f"Python {platform.python_version()}, JAX {jax.__version__} ({jax.default_backend()}), "
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f} before / {load_after[0]:.2f} after.",
        f"Seed-style and compiled final rewards agree to {agree:.1e}; sweep final reward range "
        f"[{float(np.min(grid.final_reward)):.3f}, {float(np.max(grid.final_reward)):.3f}].",
        "",
        "| measurement | value | notes |",
        "|---|---|---|",
    ]
    table = "\n".join(header + [f"| {a} | {b} | {c} |" for a, b, c in rows]) + "\n"
    print(table)
    warnings = []
    if ratio < SPEEDUP_TARGET:
        warnings.append(f"WARN: compiled trainer only {ratio:.0f}x faster than the seed-style loop (target {SPEEDUP_TARGET:.0f}x)")
    if sweep_med > SWEEP_TARGET_S:
        warnings.append(f"WARN: 32x32 sweep took {sweep_med:.2f} s (target < {SWEEP_TARGET_S:.0f} s)")
    if recompiled:
        warnings.append(f"WARN: the sweep re-traced {recompiled} time(s) when only beta/epsilon values moved")
    for w in warnings:
        print(w)
    if load_before[0] > (os.cpu_count() or 1):
        print(f"note: the machine was busy (load {load_before[0]:.1f} on {os.cpu_count()} CPUs); figures are noisy")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(table + "".join(f"\n{w}" for w in warnings) + ("\n" if warnings else ""))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
