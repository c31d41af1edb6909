"""The TRL side of `make bench-peer`: TRL's PPO trainer on the exported task, offline, in .venv-peer.

    .venv-peer/bin/python bench/peer_trl.py TASK.npz OUT_PREFIX

TRL's PPOTrainer (``trl.experimental.ppo``) takes Hugging Face models, a tokenizer and a dataset
of prompts. Nothing is downloaded: the tokenizer is a word-level one built in memory over the
task's vocabulary (5 content tokens, EOS, PAD, one token per prompt); the policy is OUR policy
network (features -> tanh layer of width ``hidden`` -> action logits) wrapped as a
``PreTrainedModel`` + ``GenerationMixin`` and loaded with the task's SFT reference parameters (a
second copy is TRL's frozen reference); the value model is our value network behind the
interface TRL's ``get_reward`` reads (``base_model_prefix`` backbone + ``score`` head), randomly
initialised like ours; the reward model is a module of the same interface that computes the
task's frozen linear proxy from the response's token counts, length and EOS. The
hyperparameters are the task's (batch, epochs, minibatches, beta with the k1 estimator, clip
ranges, GAE, learning rate, temperature 1, missing-EOS penalty, 6 new tokens, stop at EOS).

Writes ``OUT_PREFIX.json`` with ``status`` ``ok`` (timings) or ``failed`` (the stage, the error
and the reason), and ``OUT_PREFIX.npz``: policy snapshots every ``eval_every`` iterations in our
parameter layout, for our exact evaluator on the JAX side. An optional third argument shortens
the run (iterations), for a quick check.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

for k, v in dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_DISABLED="true",
                 TOKENIZERS_PARALLELISM="false").items():
    os.environ.setdefault(k, v)

import numpy as np  # noqa: E402


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    task_path, out = argv[0], argv[1]
    rec = {"status": "failed", "stage": "import"}

    def save():
        with open(out + ".json", "w") as f:
            json.dump(rec, f, indent=1)

    try:
        import torch
        import transformers
        import trl
        rec.update(torch=torch.__version__, transformers=transformers.__version__, trl=trl.__version__)
        torch.set_num_threads(1)
        rec["stage"] = "import PPOTrainer"
        try:
            from trl.experimental.ppo import PPOConfig, PPOTrainer
        except ImportError:
            from trl import PPOConfig, PPOTrainer  # older layout
        from datasets import Dataset
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        t = {k: v for k, v in np.load(task_path).items()}
        P, V, T, H = (int(t[k]) for k in ("n_prompts", "n_tokens", "max_len", "hidden"))
        cfg = {k[4:]: t[k].item() for k in t if k.startswith("cfg_")}
        if len(argv) > 2:  # a shorter run, for a quick check
            cfg["iterations"] = int(argv[2])
        eos, pad = V, V + 1
        prompt_ids = [V + 2 + p for p in range(P)]
        vocab = {chr(ord("a") + i): i for i in range(V)}
        vocab.update({"<eos>": eos, "<pad>": pad})
        vocab.update({f"<p{p}>": prompt_ids[p] for p in range(P)})
        rec["stage"] = "tokenizer"
        tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
        tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>", unk_token="<pad>")
        tok.padding_side = "left"

        rec["stage"] = "models"
        torch.manual_seed(int(cfg["seed"]))
        F = P + T + (V + 1) + V
        A = V + 1

        def prefix_features(ids):
            """Our policy's features of the prefix before each response token; ids = [prompt, y_0, y_1, ...].

            Position i of ``ids`` predicts response token i. TRL writes 0 over padding before its
            forward passes; those positions come after the EOS and are masked, so they never matter.
            """
            b, L = ids.shape
            prompt = (ids[:, 0] - (V + 2)).clamp(0, P - 1)
            resp = ids[:, 1:]
            content = torch.nn.functional.one_hot(torch.where(resp < V, resp, torch.full_like(resp, V)), V + 1)[..., :V]
            counts = torch.cat([torch.zeros(b, 1, V), content.float().cumsum(1)], 1)  # [B, L, V]
            prev = torch.cat([torch.full((b, 1), V, dtype=ids.dtype), resp.clamp(max=V)], 1)
            pos = torch.arange(L).clamp(max=T - 1)
            return torch.cat([
                torch.nn.functional.one_hot(prompt, P).float()[:, None, :].expand(b, L, P),
                torch.nn.functional.one_hot(pos, T).float()[None].expand(b, L, T),
                torch.nn.functional.one_hot(prev, V + 1).float(), counts / T,
            ], -1)

        class MLPConfig(transformers.PretrainedConfig):
            model_type = "rlhf_lab_sequences_mlp"

        class Trunk(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.l1 = torch.nn.Linear(F, H)

            def forward(self, input_ids=None, **_):
                h = torch.tanh(self.l1(prefix_features(input_ids)))
                return transformers.modeling_outputs.BaseModelOutput(last_hidden_state=h, hidden_states=(h,))

        class MLPPolicy(transformers.PreTrainedModel, transformers.GenerationMixin):
            """Our policy network (features -> tanh(width H) -> 6 action logits) as a Hugging Face causal LM."""

            config_class = MLPConfig
            base_model_prefix = "trunk"
            main_input_name = "input_ids"

            def __init__(self, config):
                super().__init__(config)
                self.trunk = Trunk()
                self.out = torch.nn.Linear(H, A)

            def forward(self, input_ids=None, attention_mask=None, output_hidden_states=False, return_dict=True, **_):
                h = self.trunk(input_ids).last_hidden_state
                act = self.out(h)
                logits = torch.full(act.shape[:-1] + (self.config.vocab_size,), -1e9, dtype=act.dtype)
                logits = torch.cat([act, logits[..., A:]], -1)
                return transformers.modeling_outputs.CausalLMOutput(logits=logits, hidden_states=(h,) if output_hidden_states else None)

            def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **_):
                return {"input_ids": input_ids, "attention_mask": attention_mask}

            def load_ours(self, prefix):
                with torch.no_grad():
                    self.trunk.l1.weight.copy_(torch.tensor(t[prefix + "w1"]).T)
                    self.trunk.l1.bias.copy_(torch.tensor(t[prefix + "b1"]))
                    self.out.weight.copy_(torch.tensor(t[prefix + "w_out"]).T)
                    self.out.bias.copy_(torch.tensor(t[prefix + "b_out"]))

            def export_ours(self):
                return {"w1": self.trunk.l1.weight.detach().numpy().T.copy(), "b1": self.trunk.l1.bias.detach().numpy().copy(),
                        "w_out": self.out.weight.detach().numpy().T.copy(), "b_out": self.out.bias.detach().numpy().copy()}

        class MLPValue(torch.nn.Module):
            """Our value network: same trunk shape, separate parameters, a scalar ``score`` head."""

            base_model_prefix = "trunk"

            def __init__(self):
                super().__init__()
                self.trunk = Trunk()
                self.score = torch.nn.Linear(H, 1)
                with torch.no_grad():  # our init: N(0, 1/F) first layer, 0.1/sqrt(H) output, zero biases
                    self.trunk.l1.weight.normal_(0.0, 1.0 / np.sqrt(F))
                    self.trunk.l1.bias.zero_()
                    self.score.weight.normal_(0.0, 0.1 / np.sqrt(H))
                    self.score.bias.zero_()

        mcfg = MLPConfig(vocab_size=len(vocab), eos_token_id=eos, pad_token_id=pad, bos_token_id=eos, num_hidden_layers=1,
                         hidden_size=H, use_cache=False)
        policy = MLPPolicy(mcfg)
        policy.load_ours("ref_")
        policy.generation_config = transformers.GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=eos)
        ref = MLPPolicy(mcfg)
        ref.load_ours("ref_")
        value_model = MLPValue()
        snapshots = [policy.export_ours()]
        it_times = []

        class Snap(transformers.TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                it_times.append((time.perf_counter(), time.process_time()))
                if len(it_times) % int(cfg["eval_every"]) == 0:
                    snapshots.append(policy.export_ours())
                return control

        w = torch.tensor(t["proxy_weights"], dtype=torch.float32)
        b = float(t["proxy_bias"])

        class ProxyBackbone(torch.nn.Module):
            """Hidden state at position i = proxy features of the response up to and including token i."""

            def forward(self, input_ids=None, attention_mask=None, **_):
                ids = input_ids
                first = ids[:, :1]  # the prompt token (left padding never occurs: prompts are 1 token)
                prompt = (first - (V + 2)).clamp(0, P - 1)[:, 0]
                content = torch.nn.functional.one_hot(torch.where(ids < V, ids, torch.full_like(ids, V)), V + 1)[..., :V]
                counts = content.float().cumsum(1)  # [B, L, V]
                is_eos = (ids == eos).float().cumsum(1).clamp(max=1.0)
                length = counts.sum(-1, keepdim=True)
                per_prompt = (torch.nn.functional.one_hot(prompt, P).float()[:, None, :, None] * counts[:, :, None, :])
                phi = torch.cat([per_prompt.flatten(2), length, is_eos[..., None]], dim=-1)
                return transformers.modeling_outputs.BaseModelOutput(last_hidden_state=phi, hidden_states=(phi,))

        class ProxyRewardModel(torch.nn.Module):
            base_model_prefix = "backbone"

            def __init__(self):
                super().__init__()
                self.backbone = ProxyBackbone()
                self.score = torch.nn.Linear(w.shape[0], 1)
                with torch.no_grad():
                    self.score.weight.copy_(w[None])
                    self.score.bias.fill_(b)

        reward = ProxyRewardModel()
        rec["stage"] = "dataset"
        n_rows = int(cfg["iterations"]) * int(cfg["batch_size"])
        ds = Dataset.from_dict({"input_ids": [[prompt_ids[i % P]] for i in range(n_rows)]})
        rec["stage"] = "PPOConfig"
        outdir = out + "_trainer"
        args = PPOConfig(
            output_dir=outdir, report_to=[], use_cpu=True, seed=int(cfg["seed"]), save_strategy="no",
            logging_strategy="no", disable_tqdm=True, num_sample_generations=0,
            learning_rate=float(cfg["learning_rate"]), lr_scheduler_type="constant", adam_epsilon=1e-5,
            per_device_train_batch_size=int(cfg["batch_size"]), gradient_accumulation_steps=1,
            num_mini_batches=int(cfg["batch_size"]) // int(cfg["minibatch_size"]), num_ppo_epochs=int(cfg["epochs"]),
            total_episodes=n_rows, local_rollout_forward_batch_size=int(cfg["batch_size"]),
            response_length=T, stop_token="eos", temperature=1.0, missing_eos_penalty=float(t["missing_eos_penalty"]),
            kl_coef=float(cfg["beta"]), kl_estimator="k1", cliprange=float(cfg["epsilon"]),
            cliprange_value=float(cfg["value_clip"]), vf_coef=1.0, gamma=float(cfg["gamma"]), lam=float(cfg["lam"]),
            whiten_rewards=False,
        )
        rec["stage"] = "PPOTrainer()"
        trainer = PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                             train_dataset=ds, value_model=value_model, callbacks=[Snap()])
        rec["stage"] = "train()"
        c0, t0 = time.process_time(), time.perf_counter()
        trainer.train()
        rec["run_wall"], rec["run_cpu"] = [time.perf_counter() - t0], [time.process_time() - c0]
        walls = np.diff([t0] + [a for a, _ in it_times])
        cpus = np.diff([c0] + [b for _, b in it_times])
        rec["iterations"] = len(it_times)
        rec["iteration_wall_median"] = float(np.median(walls)) if len(walls) else None
        rec["iteration_cpu_median"] = float(np.median(cpus)) if len(cpus) else None
        rec["status"] = "ok"
        rec["seeds"] = [int(cfg["seed"])]
        np.savez(out + ".npz", **{k: np.stack([s[k] for s in snapshots])[None] for k in snapshots[0]})
        rec["notes"] = (f"{len(it_times)} iterations; median iteration {rec['iteration_wall_median'] * 1e3:.1f} ms wall, "
                        f"{rec['iteration_cpu_median'] * 1e3:.1f} ms CPU; our policy and value networks wrapped as "
                        "Hugging Face modules, starting from the task's reference; 1 torch thread")
        rec["summary"] = (
            "TRL's PPOTrainer (trl.experimental.ppo) ran offline. It was given our own networks, wrapped as Hugging "
            "Face modules (a PreTrainedModel + GenerationMixin policy of width "
            f"{H} loaded with the task's SFT reference parameters, which is also its frozen reference; a value "
            "module with TRL's backbone + score interface; the proxy as a reward module of the same interface), a "
            "word-level tokenizer built in memory and a dataset of the 4 one-token prompts. Its settings: batch "
            f"{cfg['batch_size']}, {cfg['epochs']} epochs of {int(cfg['batch_size']) // int(cfg['minibatch_size'])} "
            f"minibatches, kl_coef {cfg['beta']} with the k1 estimator in the per-token reward, cliprange "
            f"{cfg['epsilon']}, cliprange_value {cfg['value_clip']}, vf_coef 1, gamma {cfg['gamma']}, lam {cfg['lam']}, "
            "temperature 1, missing_eos_penalty 1, response_length 6, stop at EOS, constant learning rate "
            f"{cfg['learning_rate']}, AdamW eps 1e-5 without weight decay. Differences that remain: TRL's own "
            "sampler (transformers' generate, here without a KV cache: every new token reruns the whole prefix) and "
            "data loader, the position of the score (TRL adds it on the first PAD after the EOS and fits the value "
            "there; ours sits on the EOS), and its bookkeeping (logging statistics every step).")
        save()
        return 0
    except Exception as exc:  # recorded, not hidden: the benchmark prints it in its results
        rec["error"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
        rec["reason"] = f"{type(exc).__name__} at stage '{rec['stage']}': {exc}"[:1000]
        save()
        print(rec["error"], file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
