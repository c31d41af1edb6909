"""Peer benchmark of the sequence-level PPO (`make bench-peer`; optional, not in CI).

Our compiled run and our Python loop of jitted steps (this process, .venv, JAX) beside the peer
(separate processes in .venv-peer, PyTorch) on the SAME task and configuration, one after the
other on the same machine in the same invocation:

1. the default task and configuration are exported to a .npz (language sizes, the frozen reference
   policy's parameters, the linear proxy's weights and bias, the missing-EOS penalty, every PPO
   hyperparameter);
2. ours: the whole compiled run after compile, then the Python-loop variant;
3. TRL's PPO trainer is tried first (bench/peer_trl.py), offline, with our networks of the same
   width wrapped as Hugging Face modules (the policy from the task's reference, a randomly
   initialised critic, the proxy as the reward module); whether it ran, or the stage, the exact
   error and the reason it could not, is recorded;
4. the plain PyTorch implementation of the same algorithm (bench/peer_torch.py) is measured;
5. every peer policy snapshot is converted back and evaluated with our exact evaluator
   (`rlhf_lab.sequences.evaluate_policy`, enumeration of all responses), so quality is compared
   as well as speed.

    .venv/bin/python bench/bench_peer.py [--repeats N] [--peer-repeats N] [--peer-python PATH]

Writes bench/results/peer.md. Its "What differs" section (DIFFERENCES below) says what the numbers
do and do not compare.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rlhf_lab import sequences as sq  # noqa: E402
from rlhf_lab.sequences import ppo  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "peer.md"
PEER_PY = ROOT / ".venv-peer" / "bin" / "python"
PARAM_NAMES = ("w1", "b1", "w_out", "b_out")

#: What differs between our runs and the peers', beyond the random number generators (peer.md).
DIFFERENCES = [
    "**Where the score sits.** Ours and the plain PyTorch peer put the score on the last real token (the EOS, or "
    "the 6th token of a truncated response). TRL's PPOTrainer adds it one position later, on the first PAD after "
    "the EOS when there is one (its `sequence_lengths + 1`), and keeps the value and the value loss on that "
    "position too: its critic fits a value on a padding slot.",
    "**Forward work while sampling.** TRL samples with transformers' `generate`, and our network wrapped for it "
    "has no KV cache, so each new token reruns the network on the whole prefix: up to 1 + 2 + ... + 6 = 21 "
    "positions for a 6-token response where an incremental sampler (ours, the plain PyTorch peer) runs 6, "
    "3.5 times the forward work of generation.",
    "**What a run includes.** Our timed runs include the exact evaluation (enumeration of all responses) every "
    "`eval_every` iterations; the peers' runs do not (their snapshots are evaluated afterwards, untimed).",
    "**What the ratio to TRL measures.** The network has 21 input features and one tanh layer of width 32, so a "
    "step is tiny and the ratio measures framework overhead per step (Python, the trainer's bookkeeping, many "
    "small kernel launches) on a task this small, not speed at language-model scale, where the model's forward "
    "and backward passes dominate.",
]


def export_task(task: sq.Task, config: sq.SeqPPOConfig, path: Path) -> None:
    """Everything the peer needs to run the same task, as plain arrays (no JAX on the other side)."""
    lang, a = task.lang, task.arrays
    data = dict(n_prompts=lang.n_prompts, n_tokens=lang.n_tokens, max_len=lang.max_len, hidden=task.hidden,
                proxy_weights=np.asarray(a.proxy_weights), proxy_bias=np.asarray(a.proxy_bias),
                missing_eos_penalty=np.asarray(a.missing_eos_penalty),
                # the proxy score of every response (for a peer that wants a lookup table), [P, R]
                score_table=np.asarray(a.score), response_tokens=sq.prefix_tree(lang).response_tokens)
    for k in PARAM_NAMES:
        data[f"ref_{k}"] = np.asarray(a.ref_params[k])
    for f in ("iterations", "batch_size", "epochs", "minibatch_size", "eval_every", "beta", "epsilon",
              "learning_rate", "lam", "gamma", "value_clip", "seed"):
        data[f"cfg_{f}"] = np.asarray(getattr(config, f))
    np.savez(path, **data)


def timed(fn, repeats: int):
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def run_peer(script: str, task_file: Path, out: Path, peer_py: Path, extra=(), timeout=900):
    """Run one peer script in the peer environment; returns (json record or None, returncode, stderr tail)."""
    cmd = [str(peer_py), str(ROOT / "bench" / script), str(task_file), str(out), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_DISABLED="true",
               TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, "timeout", f"timed out after {timeout} s", time.perf_counter() - t0
    rec = None
    if Path(str(out) + ".json").exists():
        rec = json.loads(Path(str(out) + ".json").read_text())
    return rec, proc.returncode, proc.stderr[-3000:], time.perf_counter() - t0


def evaluate_snapshots(task, npz: Path, beta: float) -> list[list[dict]]:
    """Exact numbers of every peer policy snapshot: ``[run][snapshot] -> evaluate_policy dict``."""
    with np.load(npz) as f:
        snaps = {k: f[k] for k in PARAM_NAMES}
    out = []
    for r in range(snaps["w1"].shape[0]):
        out.append([sq.evaluate_policy(task, {k: jnp.asarray(snaps[k][r, e]) for k in PARAM_NAMES}, beta)
                    for e in range(snaps["w1"].shape[1])])
    return out


def quality(gold, proxy, kl) -> str:
    gold = np.asarray(gold)
    return (f"gold {gold[0]:.3f} -> peak {gold.max():.3f} -> final {gold[-1]:.3f}; "
            f"proxy final {float(np.asarray(proxy)[-1]):.3f}; KL final {float(np.asarray(kl)[-1]):.2f} nats")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of our compiled run (default 3)")
    parser.add_argument("--peer-repeats", type=int, default=3, help="runs of the PyTorch peer (seeds s, s+1, ...)")
    parser.add_argument("--peer-python", default=str(PEER_PY), help="python of the peer environment")
    parser.add_argument("--skip-trl", action="store_true", help="do not try TRL's PPO trainer")
    args = parser.parse_args(argv)
    peer_py = Path(args.peer_python)
    if not peer_py.exists():
        print(f"no peer environment at {peer_py}: run `make bench-peer`", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    task = sq.default_task()
    config = sq.SeqPPOConfig()
    med = statistics.median
    work = Path(tempfile.mkdtemp(prefix="bench_peer_"))
    task_file = work / "task.npz"
    export_task(task, config, task_file)

    # ---- ours: the compiled run -------------------------------------------------------------
    hp, key = config.hparams(), jax.random.key(config.seed)
    fn = ppo.make_train(task.lang, config.static, task.hidden)
    c0, t0 = time.process_time(), time.perf_counter()
    compiled = fn.lower(key, hp, task.arrays).compile()
    compile_s, compile_cpu = time.perf_counter() - t0, time.process_time() - c0
    result = jax.block_until_ready(compiled(key, hp, task.arrays))
    run_wall, run_cpu = timed(lambda: jax.block_until_ready(compiled(key, hp, task.arrays)), args.repeats)
    ours_seeds = [result]
    for s in range(1, args.peer_repeats):  # same seeds as the peer's runs, for the quality comparison
        k = jax.random.key(config.seed + s)
        ours_seeds.append(jax.block_until_ready(compiled(k, hp, task.arrays)))

    # ---- ours: Python loop of jitted steps ----------------------------------------------------
    init, step, evaluate = ppo.make_step(task.lang, config.static, task.hidden)
    small = ppo.rollout_arrays(task.arrays)

    def loop_run():
        carry = init(key, task.arrays, hp)
        evs = [evaluate(carry[0]["policy"], task.arrays, beta=hp["beta"])]
        for i in range(config.iterations):
            carry, _ = step(carry, hp, small)
            if (i + 1) % config.eval_every == 0:
                evs.append(evaluate(carry[0]["policy"], task.arrays, beta=hp["beta"]))
        return jax.block_until_ready(jnp.stack(evs))

    t0 = time.perf_counter()
    loop_run()
    loop_first = time.perf_counter() - t0
    loop_wall, loop_cpu = timed(loop_run, 2)

    # ---- the peer: TRL first, then plain PyTorch ---------------------------------------------------
    trl_rec, trl_rc, trl_err, trl_secs = (None, "skipped", "", 0.0)
    if not args.skip_trl:
        trl_rec, trl_rc, trl_err, trl_secs = run_peer("peer_trl.py", task_file, work / "trl", peer_py)
    torch_rec, torch_rc, torch_err, _ = run_peer("peer_torch.py", task_file, work / "torch", peer_py,
                                                 ["--repeats", str(args.peer_repeats)])
    if torch_rec is None or torch_rc != 0:
        print(torch_err, file=sys.stderr)
        raise SystemExit(f"the PyTorch peer failed (exit {torch_rc})")
    peer_evals = evaluate_snapshots(task, work / "torch.npz", config.beta)
    trl_evals = None
    if trl_rec and trl_rec.get("status") == "ok" and (work / "trl.npz").exists():
        trl_evals = evaluate_snapshots(task, work / "trl.npz", config.beta)
    load_after = os.getloadavg()

    # ---- the table --------------------------------------------------------------------------------
    I = config.iterations
    ours_run, ours_loop = med(run_wall), med(loop_wall)
    peer_runs = torch_rec["run_wall"]
    peer_run, peer_cpu = med(peer_runs), med(torch_rec["run_cpu"])

    def row(name, run_s, cpu_s, notes):
        return f"| {name} | {run_s / I * 1e3:.2f} ms | {run_s:.3f} s | {cpu_s:.3f} s | {notes} |"

    ours_q = [quality(r.gold, r.proxy, r.kl) for r in ours_seeds]
    peer_q = [quality([e["gold"] for e in ev], [e["proxy"] for e in ev], [e["kl"] for e in ev]) for ev in peer_evals]
    rows = [
        row("ours: one compiled call (`train`, after compile)", ours_run, med(run_cpu),
            f"median of {len(run_wall)}, min {min(run_wall):.3f} s; exact evaluation every {config.eval_every} "
            f"iterations included; compile {compile_s:.1f} s (CPU {compile_cpu:.1f} s), once per shape"),
        row("ours: Python loop of jitted steps", ours_loop, med(loop_cpu),
            f"median of {len(loop_wall)}; first call incl. compile {loop_first:.1f} s; exact evaluation included"),
        row(f"peer: {torch_rec['implementation']}", peer_run, peer_cpu,
            f"median of {len(peer_runs)} runs (seeds {config.seed}..{config.seed + len(peer_runs) - 1}); median "
            f"iteration {torch_rec['iteration_wall_median'] * 1e3:.2f} ms wall, "
            f"{torch_rec['iteration_cpu_median'] * 1e3:.2f} ms CPU; {torch_rec['torch_threads']} torch thread(s); "
            f"no exact evaluation inside the run"),
    ]
    if trl_rec and trl_rec.get("status") == "ok":
        rows.append(row("peer: TRL PPOTrainer", med(trl_rec["run_wall"]), med(trl_rec["run_cpu"]),
                        trl_rec.get("notes", "")))
    ratio_rows = [
        f"| peer / ours compiled | {peer_run / ours_run:.1f}x | CPU {peer_cpu / med(run_cpu):.1f}x |",
        f"| peer / ours Python loop | {peer_run / ours_loop:.1f}x | CPU {peer_cpu / med(loop_cpu):.1f}x |",
        f"| ours Python loop / ours compiled | {ours_loop / ours_run:.2f}x | CPU {med(loop_cpu) / med(run_cpu):.2f}x |",
    ]
    if trl_rec and trl_rec.get("status") == "ok":
        trl_run, trl_cpu = med(trl_rec["run_wall"]), med(trl_rec["run_cpu"])
        ratio_rows += [
            f"| TRL PPOTrainer / ours compiled | {trl_run / ours_run:.0f}x | CPU {trl_cpu / med(run_cpu):.0f}x |",
            f"| TRL PPOTrainer / plain PyTorch peer | {trl_run / peer_run:.0f}x | CPU {trl_cpu / peer_cpu:.0f}x |",
        ]
    lang = task.lang
    lines = [
        f"# Peer benchmark: sequence-level PPO, ours (JAX) vs a PyTorch peer "
        f"({dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')})",
        "",
        f"Task: `rlhf_lab.sequences.default_task()` ({lang.n_prompts} prompts, {lang.n_tokens} tokens + EOS, max length "
        f"{lang.max_len}). Configuration: `SeqPPOConfig()` = {I} iterations x {config.batch_size} responses, "
        f"{config.epochs} epochs of {config.batch_size // config.minibatch_size} minibatches of {config.minibatch_size}, "
        f"beta {config.beta}, epsilon {config.epsilon}, lr {config.learning_rate}, GAE lambda {config.lam}, gamma "
        f"{config.gamma}, value clip {config.value_clip}; policy and value networks of width {task.hidden} (one tanh layer, "
        f"separate); the peer starts from the same reference parameters and optimises the same proxy score.",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}; load average "
        f"{load_before[0]:.2f} before / {load_after[0]:.2f} after. With a load above the core count wall times are "
        f"inflated; process CPU times are given beside them. Ours and the peer ran one after the other in this invocation.",
        f"Versions: JAX {jax.__version__} (ours, `.venv`); peer: Python {torch_rec['python']}, torch {torch_rec['torch']}"
        + (f", transformers {trl_rec['transformers']}, trl {trl_rec['trl']}" if trl_rec and "trl" in trl_rec else "")
        + " (`.venv-peer`, pins in `bench/requirements-peer.txt`).",
        "",
        "## Speed",
        "",
        "| what | per PPO iteration | per run (wall) | per run (CPU) | notes |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "| ratio | wall | CPU |",
        "|---|---|---|",
        *ratio_rows,
        "",
        "## Quality (exact, by enumeration with our evaluator, prompts averaged)",
        "",
        f"Exact optimum pi*_beta at beta {config.beta}: "
        + ", ".join(f"{k} {v:.3f}" for k, v in sq.optimum_summary(task, config.beta).items()) + ".",
        "",
        "| run | seed | exact gold / proxy / KL | regret final |",
        "|---|---|---|---|",
        *[f"| ours (compiled) | {config.seed + s} | {ours_q[s]} | {float(ours_seeds[s].regret[-1]):.3f} |"
          for s in range(len(ours_seeds))],
        *[f"| peer (plain PyTorch) | {config.seed + s} | {peer_q[s]} | {peer_evals[s][-1]['regret']:.3f} |"
          for s in range(len(peer_evals))],
    ]
    if trl_evals:
        for s, ev in enumerate(trl_evals):
            lines.append(f"| peer (TRL PPOTrainer) | {trl_rec['seeds'][s]} | {quality([e['gold'] for e in ev], [e['proxy'] for e in ev], [e['kl'] for e in ev])} "
                         f"| {ev[-1]['regret']:.3f} |")
    lines += ["", "The two implementations use different random number generators, so single runs differ; "
              "the comparison is of the curves' shape (gold up then down while the proxy rises) and of the final "
              "numbers across seeds.", "", "## What differs", "", *[f"* {d}" for d in DIFFERENCES],
              "", "## TRL's PPO trainer", ""]
    if args.skip_trl:
        lines.append("Not tried in this invocation (`--skip-trl`).")
    elif trl_rec and trl_rec.get("status") == "ok":
        lines.append(trl_rec.get("summary", "TRL's PPOTrainer ran; see the tables above."))
        lines += ["", "Why these pins: trl 1.12.0 is used because the PPO trainer is gone from the later releases "
                  "(neither 1.14.2 nor 1.15.0 nor 1.16.0 ships `trl.experimental.ppo`, and the top-level "
                  "`trl.PPOTrainer` moved there earlier). Not measured separately: TRL's loop calls `gc.collect()` "
                  "twice per iteration and gathers logging statistics every iteration, which an algorithm this small "
                  "cannot hide; the plain PyTorch peer above is the same algorithm without that machinery."]
    else:
        lines.append(f"TRL's PPOTrainer could not run this task (exit code {trl_rc}, {trl_secs:.1f} s).")
        if trl_rec:
            lines += ["", f"Reason: {trl_rec.get('reason', '(none recorded)')}", "", "Error:", "", "```",
                      trl_rec.get("error", "").strip()[-2500:], "```"]
        else:
            lines += ["", "```", trl_err.strip()[-2500:], "```"]
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    shutil.rmtree(work, ignore_errors=True)  # the exported task, the peers' records and TRL's output dir
    return 0


if __name__ == "__main__":
    sys.exit(main())
