"""The peer side of `make bench-peer`: sequence-level PPO in plain PyTorch, on a task exported by
bench/bench_peer.py. Runs in .venv-peer (torch, no JAX).

    .venv-peer/bin/python bench/peer_torch.py TASK.npz OUT_PREFIX [--repeats N]

The algorithm is the one of rlhf_lab.sequences.ppo, written again in eager PyTorch, same sizes,
same hyperparameters, same networks:

* policy and value networks: features -> tanh layer of width ``hidden`` -> output (separate
  networks); the policy starts as a copy of the exported reference, the critic is random
  (N(0, 1/n_features) first layer, 0.1/sqrt(hidden) output layer, zero biases);
* features of a prefix: one-hot prompt, one-hot position, one-hot previous token (or start),
  counts of each content token so far divided by ``max_len``;
* per iteration: ``batch_size`` responses (prompts cycle), sampled token by token, PAD after EOS;
  behaviour log-probs, reference log-probs and old values computed once and frozen; per-token
  rewards ``-beta (old_logp - ref_logp)`` on every real token plus the score (linear proxy minus the
  missing-EOS penalty) on the last real token; GAE(gamma, lambda) with no bootstrap past the last
  real token; advantages whitened over real tokens only; ``epochs`` passes of shuffled minibatches
  of the clipped policy loss plus the clipped value loss; one Adam (eps 1e-5) for both networks.

Writes ``OUT_PREFIX.json`` (timings, versions) and ``OUT_PREFIX.npz`` (policy snapshots every
``eval_every`` iterations of every run, ``[run, snapshot, ...]``, snapshot 0 = the reference) for
the exact evaluator on the JAX side.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np
import torch


def load_task(path: str) -> dict:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


class Peer:
    def __init__(self, t: dict):
        self.P, self.V, self.T = int(t["n_prompts"]), int(t["n_tokens"]), int(t["max_len"])
        self.eos, self.pad, self.A = self.V, self.V + 1, self.V + 1
        self.F = self.P + self.T + (self.V + 1) + self.V
        self.hidden = int(t["hidden"])
        cfg = {k[4:]: t[k].item() for k in t if k.startswith("cfg_")}
        self.cfg = cfg
        self.ref = {k: torch.tensor(t[f"ref_{k}"], dtype=torch.float32) for k in ("w1", "b1", "w_out", "b_out")}
        self.proxy_w = torch.tensor(t["proxy_weights"], dtype=torch.float32)
        self.proxy_b = float(t["proxy_bias"])
        self.penalty = float(t["missing_eos_penalty"])

    # ---- networks -------------------------------------------------------------------------
    @staticmethod
    def forward(p: dict, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ p["w1"] + p["b1"]) @ p["w_out"] + p["b_out"]

    def step_features(self, prompts, position: int, prev, counts) -> torch.Tensor:
        b = prompts.shape[0]
        pos = torch.zeros(b, self.T)
        pos[:, position] = 1.0
        return torch.cat([
            torch.nn.functional.one_hot(prompts, self.P).float(), pos,
            torch.nn.functional.one_hot(prev, self.V + 1).float(), counts / self.T,
        ], dim=1)

    def context_features(self, prompts, tokens) -> torch.Tensor:
        """``[B, T, F]`` features of the prefix before every position (rows past the end: padding)."""
        b, T = tokens.shape
        content = torch.nn.functional.one_hot(torch.clamp(tokens, max=self.V), self.V + 1)[..., :self.V].float()
        counts_before = torch.cumsum(content, dim=1) - content
        prev = torch.cat([torch.full((b, 1), self.V, dtype=tokens.dtype), torch.clamp(tokens[:, :-1], max=self.V)], dim=1)
        return torch.cat([
            torch.nn.functional.one_hot(prompts, self.P).float()[:, None, :].expand(b, T, self.P),
            torch.eye(T)[None].expand(b, T, T),
            torch.nn.functional.one_hot(prev, self.V + 1).float(), counts_before / self.T,
        ], dim=2)

    def token_logp(self, p: dict, feats, tokens) -> torch.Tensor:
        logp = torch.log_softmax(self.forward(p, feats), dim=-1)
        picked = torch.gather(logp, -1, torch.clamp(tokens, max=self.A - 1)[..., None])[..., 0]
        return torch.where(tokens < self.A, picked, torch.zeros_like(picked))

    # ---- sampling and scoring ---------------------------------------------------------------
    @torch.no_grad()
    def sample(self, p: dict, prompts, gen: torch.Generator):
        b = prompts.shape[0]
        prev = torch.full((b,), self.V, dtype=torch.long)
        counts = torch.zeros(b, self.V)
        done = torch.zeros(b, dtype=torch.bool)
        out = []
        for t in range(self.T):
            logits = self.forward(p, self.step_features(prompts, t, prev, counts))
            tok = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen)[:, 0]
            tok = torch.where(done, torch.full_like(tok, self.pad), tok)
            counts = counts + torch.nn.functional.one_hot(torch.clamp(tok, max=self.V), self.V + 1)[:, :self.V].float()
            done = done | (tok == self.eos)
            prev = torch.clamp(tok, max=self.V)
            out.append(tok)
        tokens = torch.stack(out, dim=1)
        is_eos = (tokens == self.eos).long()
        mask = ((tokens != self.pad) & (torch.cumsum(is_eos, 1) - is_eos == 0)).float()
        return tokens, mask

    def score(self, prompts, tokens, mask) -> torch.Tensor:
        real = mask > 0
        counts = torch.nn.functional.one_hot(torch.where(real, tokens, torch.full_like(tokens, self.V)),
                                             self.V + 1)[..., :self.V].float().sum(1)
        length = counts.sum(1)
        has_eos = (real & (tokens == self.eos)).any(1).float()
        per_prompt = (torch.nn.functional.one_hot(prompts, self.P).float()[:, :, None] * counts[:, None, :]).reshape(len(prompts), -1)
        phi = torch.cat([per_prompt, length[:, None], has_eos[:, None]], dim=1)
        return phi @ self.proxy_w + self.proxy_b - self.penalty * (1.0 - has_eos)

    # ---- PPO pieces ---------------------------------------------------------------------------
    @staticmethod
    def masked_mean(x, m):
        return (x * m).sum() / torch.clamp(m.sum(), min=1.0)

    def gae(self, rewards, values, mask, gamma, lam):
        values = values * mask
        next_mask = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1)
        next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], 1)
        deltas = (rewards + gamma * next_values * next_mask - values) * mask
        adv = torch.zeros_like(rewards)
        carry = torch.zeros(rewards.shape[0])
        for t in reversed(range(rewards.shape[1])):
            carry = (deltas[:, t] + gamma * lam * next_mask[:, t] * carry) * mask[:, t]
            adv[:, t] = carry
        return adv, (adv + values) * mask

    def run(self, seed: int, snapshot_every: int):
        c = self.cfg
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        policy = {k: v.clone().requires_grad_(True) for k, v in self.ref.items()}
        value = {
            "w1": (torch.randn(self.F, self.hidden, generator=gen) / np.sqrt(self.F)).requires_grad_(True),
            "b1": torch.zeros(self.hidden, requires_grad=True),
            "w_out": (torch.randn(self.hidden, 1, generator=gen) * (0.1 / np.sqrt(self.hidden))).requires_grad_(True),
            "b_out": torch.zeros(1, requires_grad=True),
        }
        opt = torch.optim.Adam(list(policy.values()) + list(value.values()), lr=c["learning_rate"], eps=1e-5)
        B, mbs, epochs = int(c["batch_size"]), int(c["minibatch_size"]), int(c["epochs"])
        beta, eps, vclip, gamma, lam = c["beta"], c["epsilon"], c["value_clip"], c["gamma"], c["lam"]
        prompts = torch.arange(B) % self.P
        snaps = [{k: v.detach().numpy().copy() for k, v in policy.items()}]
        it_wall, it_cpu, scores, sampled_kl = [], [], [], []
        for i in range(int(c["iterations"])):
            c0, t0 = time.process_time(), time.perf_counter()
            tokens, mask = self.sample(policy, prompts, gen)
            with torch.no_grad():
                feats = self.context_features(prompts, tokens)
                old_logp = self.token_logp(policy, feats, tokens) * mask
                ref_logp = self.token_logp(self.ref, feats, tokens) * mask
                old_values = self.forward(value, feats)[..., 0] * mask
                score = self.score(prompts, tokens, mask)
                length = mask.sum(1).long()
                last = torch.nn.functional.one_hot(length - 1, self.T).float()
                rewards = -beta * (old_logp - ref_logp) * mask + score[:, None] * last
                adv, returns = self.gae(rewards, old_values, mask, gamma, lam)
                mu = self.masked_mean(adv, mask)
                var = self.masked_mean((adv - mu) ** 2, mask)
                adv = (adv - mu) * torch.rsqrt(var + 1e-8) * mask
            for _ in range(epochs):
                perm = torch.randperm(B, generator=gen)
                for j in range(B // mbs):
                    idx = perm[j * mbs:(j + 1) * mbs]
                    f, tk, m = feats[idx], tokens[idx], mask[idx]
                    logp = self.token_logp(policy, f, tk)
                    ratio = torch.exp(logp - old_logp[idx])
                    a = adv[idx]
                    pl = -self.masked_mean(torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps) * a), m)
                    v = self.forward(value, f)[..., 0]
                    ov, ret = old_values[idx], returns[idx]
                    v_clip = ov + torch.clamp(v - ov, -vclip, vclip)
                    vl = 0.5 * self.masked_mean(torch.maximum((v - ret) ** 2, (v_clip - ret) ** 2), m)
                    opt.zero_grad(set_to_none=True)
                    (pl + vl).backward()
                    opt.step()
            it_wall.append(time.perf_counter() - t0)
            it_cpu.append(time.process_time() - c0)
            scores.append(float(score.mean()))
            sampled_kl.append(float((old_logp - ref_logp).sum(1).mean()))
            if (i + 1) % snapshot_every == 0:
                snaps.append({k: v.detach().numpy().copy() for k, v in policy.items()})
        return dict(it_wall=it_wall, it_cpu=it_cpu, score=scores, sampled_kl=sampled_kl), snaps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task")
    parser.add_argument("out")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: the tensors are tiny, and on a shared 2-core "
                             "machine a second thread only adds synchronisation: 2 threads measured 3-4x slower)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    peer = Peer(load_task(args.task))
    seed, every = int(peer.cfg["seed"]), int(peer.cfg["eval_every"])
    runs, all_snaps = [], []
    for r in range(args.repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        rec, snaps = peer.run(seed + r, every)
        rec["run_wall"], rec["run_cpu"] = time.perf_counter() - t0, time.process_time() - c0
        runs.append(rec)
        all_snaps.append(snaps)
    info = {
        "implementation": "plain PyTorch (eager)",
        "python": platform.python_version(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "run_wall": [r["run_wall"] for r in runs], "run_cpu": [r["run_cpu"] for r in runs],
        "iteration_wall_median": statistics.median(x for r in runs for x in r["it_wall"]),
        "iteration_cpu_median": statistics.median(x for r in runs for x in r["it_cpu"]),
        "first_iteration_wall": runs[0]["it_wall"][0],
        "score_last": runs[-1]["score"][-10:], "sampled_kl_last": runs[-1]["sampled_kl"][-10:],
        "seeds": [seed + r for r in range(args.repeats)],
    }
    with open(args.out + ".json", "w") as f:
        json.dump(info, f, indent=1)
    # [run, snapshot, ...] per parameter
    np.savez(args.out + ".npz", **{k: np.stack([np.stack([s[k] for s in snaps]) for snaps in all_snaps])
                                   for k in all_snaps[0][0]})
    print(json.dumps({k: v for k, v in info.items() if k not in ("score_last", "sampled_kl_last")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
