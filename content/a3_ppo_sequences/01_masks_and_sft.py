# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro_seq_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # a3 · RLHF on sequences, step 1: masks, the SFT loss and the preference loss
#
# The bandit assignments had one decision per episode. Here the policy writes a *response*, one
# token at a time, in a tiny language: 4 prompts, 5 content tokens `a b c d e`, an end token
# `<eos>` and a padding token `<pad>`. A response has at most 6 tokens: either some content tokens
# followed by `<eos>`, or 6 content tokens and no `<eos>` (it was *truncated*). The language is so
# small that all 19,531 responses of a prompt can be listed, so later notebooks compare every
# estimate with its exact value.
#
# Token ids: content `0..4`, EOS `5`, PAD `6`. Batches are padded to length 6 with PAD after the
# end of each response. In this notebook you write the masked pieces the whole loop rests on.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_seq_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **8 points**. The whole assignment `a3_ppo_sequences` (three notebooks) is worth **45 points**: 39 autograded and 6 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | `test_seq_response_mask` | 3 | autograded |
# | `test_seq_masked_nll` | 2 | autograded |
# | `test_seq_sequence_logprob` | 1 | autograded |
# | `test_seq_preference_loss` | 2 | autograded |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Validate's "Success! Your notebook passes all the tests." means the visible tests passed, not that you have full marks. Keep the first code cell as it is.

# %% nbgrader={"grade": false, "grade_id": "grading_start_seq", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab import grading
grading.start()

# %% nbgrader={"grade": false, "grade_id": "imports_seq_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import rlhf_lab.sequences as sq

LANG = sq.DEFAULT_LANGUAGE
decode = sq.decode                      # readable text of one response
EOS, PAD = LANG.eos, LANG.pad          # 5 and 6: two different ids
# four padded responses: "b <eos>", "<eos>" alone, a truncated one, "a c c <eos>"
examples = jnp.array([[1, EOS, PAD, PAD, PAD, PAD],
                      [EOS, PAD, PAD, PAD, PAD, PAD],
                      [0, 1, 2, 3, 4, 0],
                      [0, 2, 2, EOS, PAD, PAD]])
for row in examples:
    print(decode(LANG, row))

# %% [markdown] nbgrader={"grade": false, "grade_id": "mask_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. Which positions are real?
#
# The mask is 1 on every real token of a response **including its EOS** (EOS is sampled, has a
# log-probability and later carries the score) and 0 on padding. Write
# `response_mask(tokens, eos, pad)`: `mask[..., t] = 1` when `tokens[..., t] != pad` and no EOS occurs
# in the same response before position `t`. Use the `eos` and `pad` arguments. `tokens` is an integer
# array (JAX or NumPy) of shape `[..., T]`: a batch `[B, T]` or a single response `[T]`, so work along
# the last axis (`axis=-1`). Return a **float32** mask of the same shape as `tokens` (an integer or
# boolean mask is not accepted).

# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# how many real tokens does each of the four example responses have? What would a mask built as
# `tokens != eos` give for the second response?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "response_mask_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def response_mask(tokens, eos, pad):
    """Float32 mask [..., T] (tokens: integers, [B, T] or [T]): 1 up to and including the first EOS, 0 on padding."""
    ### BEGIN SOLUTION
    tokens = jnp.asarray(tokens)
    is_eos = (tokens == eos).astype(jnp.int32)
    eos_before = jnp.cumsum(is_eos, axis=-1) - is_eos
    return ((tokens != pad) & (eos_before == 0)).astype(jnp.float32)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "experiment_mask", "locked": true, "schema_version": 3, "solution": false, "task": false}
example_mask = np.asarray(response_mask(examples, EOS, PAD))
print(example_mask)
print("real tokens per response:", example_mask.sum(axis=1))

# %% nbgrader={"grade": false, "grade_id": "reveal_mask_not_eos", "locked": true, "schema_version": 3, "solution": false, "task": false}
# the prediction's second question: a mask built as `tokens != eos`
naive_mask = np.asarray(examples != EOS, np.float32)
print("second response, tokens != eos:", naive_mask[1], "->", int(naive_mask[1].sum()), "tokens counted")
print("second response, response_mask:", example_mask[1], "->", int(example_mask[1].sum()), "token counted")

# %% nbgrader={"grade": true, "grade_id": "test_seq_response_mask", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_seq_response_mask: EOS counted and padding masked on fresh responses (length 1, truncated, tokens after the first EOS that are not PAD, one 1-D response, other eos/pad ids)
### BEGIN HIDDEN TESTS
grading.judge("test_seq_response_mask")
### END HIDDEN TESTS
assert np.array_equal(example_mask.sum(axis=1), [2, 1, 6, 4]), (
    f"expected 2, 1, 6 and 4 real tokens (EOS counts, PAD does not), got {example_mask.sum(axis=1)}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "nll_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. The SFT loss and the log-likelihood of a response
#
# The reference policy is fitted to demonstrations by maximum likelihood. Given the log-probability
# of every demonstration token under the policy being fitted (`token_logp`, `[N, T]`, with
# arbitrary finite numbers on padding) and the mask, the SFT loss is the mean negative
# log-likelihood **per real token**:
#
# $$L = -\frac{\sum_{i,t} m_{it}\,\log\pi(y_{it}\mid x_i, y_{i,<t})}{\sum_{i,t} m_{it}}.$$
#
# The log-probability of a whole response is the masked **sum**
# $\log\pi(y\mid x) = \sum_t m_t \log\pi(y_t\mid x, y_{<t})$. Write `masked_nll(token_logp, mask)` and
# `sequence_logprob(token_logp, mask)`. Padding must never count, whatever numbers sit there
# (use `jnp.where`, not a product, if you want to be safe from `inf * 0`). Both are called with JAX
# float32 arrays and also with NumPy float64 arrays (`[N, T]`); `masked_nll` must stay differentiable
# with respect to `token_logp` (`jax.grad`).

# %% nbgrader={"grade": false, "grade_id": "masked_nll_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def masked_nll(token_logp, mask):
    """Mean negative log-likelihood per real token (a scalar); token_logp, mask: [N, T], JAX or NumPy float64."""
    ### BEGIN SOLUTION
    total = jnp.sum(jnp.where(mask > 0, token_logp, 0.0))
    return -total / jnp.maximum(jnp.sum(mask), 1.0)
    ### END SOLUTION


def sequence_logprob(token_logp, mask):
    """log pi(y) of each response: the masked sum over positions, shape [...]; inputs JAX or NumPy float64."""
    ### BEGIN SOLUTION
    return jnp.sum(jnp.where(mask > 0, token_logp, 0.0), axis=-1)
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# a uniform policy gives each of the 6 actions probability 1/6. What SFT loss (nats per token)
# does it have on the four example responses? Does leaving the EOS positions out of the mask make
# the loss larger or smaller, and what does the fitted policy then never learn?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_nll", "locked": true, "schema_version": 3, "solution": false, "task": false}
known_mask = jnp.array([[1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], jnp.float32)
uniform_logp = jnp.where(examples == PAD, 123.0, jnp.log(1.0 / 6.0))   # junk on padding on purpose
eos_dropped = known_mask * (examples != EOS)
print("SFT loss, uniform policy (nats per token):", float(masked_nll(uniform_logp, known_mask)))
print("same, EOS left out of the mask          :", float(masked_nll(uniform_logp, eos_dropped)))
print("log pi(y) per response (nats)           :", np.asarray(sequence_logprob(uniform_logp, known_mask)))

# %% nbgrader={"grade": true, "grade_id": "test_seq_masked_nll", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_masked_nll: the SFT loss is the mean NLL over real tokens (value and gradient) on fresh demonstrations, float64 inputs and one of a single token
### BEGIN HIDDEN TESTS
grading.judge("test_seq_masked_nll")
### END HIDDEN TESTS
assert abs(float(masked_nll(uniform_logp, known_mask)) - np.log(6.0)) < 1e-5, (
    "a uniform policy over 6 actions costs log 6 = 1.7918 nats per real token (padding must not count)")

# %% nbgrader={"grade": true, "grade_id": "test_seq_sequence_logprob", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# test_seq_sequence_logprob: log pi(y) is the masked sum of token log-probs on fresh responses, float64 inputs and a batch of one
### BEGIN HIDDEN TESTS
grading.judge("test_seq_sequence_logprob")
### END HIDDEN TESTS
assert np.allclose(np.asarray(sequence_logprob(uniform_logp, known_mask)), -np.log(6.0) * np.array([2, 1, 6, 4]),
                   atol=1e-5), "log pi(y) of a uniform policy is -(number of real tokens) * log 6"

# %% [markdown] nbgrader={"grade": false, "grade_id": "sft_refit_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **What leaving EOS out changes.** With the uniform policy the two losses above are the same number:
# every token costs $\log 6$, so the mean per token does not depend on which tokens are counted. The
# difference shows only once a policy is fitted. The next cell fits the course's reference twice to
# the same 2,048 demonstrations (the library's `fit_reference`: this masked loss, minimised by Adam), once
# with EOS in the mask and once without, and prints for each fitted policy the exact probability that
# a response never ends. It is a training run, so it is skipped during autograding.

# %% nbgrader={"grade": false, "grade_id": "sft_refit", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("The two SFT fits are skipped while autograding.")
else:
    demo_prompts, demo_tokens, demo_mask = sq.sample_demonstrations(sq.random_chain(LANG, 0), LANG, 2048, 0)
    demo_tokens, demo_mask = np.asarray(demo_tokens), np.asarray(demo_mask)
    tree = sq.prefix_tree(LANG)
    demo_eos_share = float(np.mean(np.any(demo_tokens == EOS, axis=1)))
    print("share of demonstrations that end with EOS:", round(demo_eos_share, 3))
    p_no_eos = {}   # per fit: the exact probability, per prompt, that a response never ends
    for name, fit_mask in (("EOS in the mask", demo_mask), ("EOS left out", demo_mask * (demo_tokens != EOS))):
        fitted = sq.fit_reference(LANG, demo_prompts, demo_tokens, fit_mask)
        _, resp_logp = sq.exact.policy_tables(fitted.params, jnp.asarray(tree.prefix_features), LANG)
        p_no_eos[name] = np.sum(np.exp(np.asarray(resp_logp, np.float64)) * (1.0 - tree.has_eos), axis=1)
        print(f"{name:15s}: P(no EOS within 6 tokens) per prompt {np.round(p_no_eos[name], 3)}")


# %% [markdown] nbgrader={"grade": false, "grade_id": "sft_refit_reveal", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Left out of the mask, EOS is never a target: nothing in the loss raises its probability, and the
# softmax gives its share to the tokens that are counted. The fitted policy then almost never stops
# (on this machine: a probability above 0.999 for every prompt of running to 6 tokens without EOS,
# against 0.43 to 0.76 with EOS counted, where the demonstrations themselves end with EOS 43% of the
# time). A policy that never samples EOS cannot be rewarded for stopping later on either.

# %% [markdown] nbgrader={"grade": false, "grade_id": "pref_intro_seq", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3. The response-pair preference loss
#
# Pairs of responses are drawn from the reference and a labeller (here: a Bradley-Terry draw on a
# hidden gold reward) says which one is better. A reward model $r$ is fitted by minimising
#
# $$L = \frac{1}{n}\sum_i \operatorname{softplus}\big(-(r(y^{c}_i) - r(y^{r}_i))\big),$$
#
# the mean of $-\log\sigma$ of the margin between the chosen and the rejected response. Write
# `preference_loss(chosen_score, rejected_score)` on the two `[n]` arrays of scores (JAX float32
# arrays, and also NumPy float64 arrays; it must stay differentiable with `jax.grad`). Use
# `jax.nn.softplus`: in float32 `sigmoid(m)` underflows to 0 for margins below about -87, so
# `-log(sigmoid(m))` is `inf` there and its gradient `nan`, while `softplus(-m)` stays finite (about `-m`).

# %% nbgrader={"grade": false, "grade_id": "preference_loss_seq_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def preference_loss(chosen_score, rejected_score):
    """Bradley-Terry loss: mean softplus(-(chosen - rejected)), a scalar; scores [n], JAX or NumPy float64."""
    ### BEGIN SOLUTION
    return jnp.mean(jax.nn.softplus(-(chosen_score - rejected_score)))
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# what is the loss of one pair at margin 0? How does it behave for a margin of +10 and of -10?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_pref", "locked": true, "schema_version": 3, "solution": false, "task": false}
margins = np.linspace(-10.0, 10.0, 101).astype(np.float32)
pair_losses = [float(preference_loss(jnp.array([m]), jnp.array([0.0]))) for m in margins]
print("loss of one pair at margins -10, 0, +10 (nats):", [round(pair_losses[i], 5) for i in (0, 50, 100)])
fig, ax = plt.subplots(figsize=(5.5, 3.2))
ax.plot(margins, pair_losses)
ax.axvline(0.0, color="grey", linestyle=":")
ax.set_xlabel("margin r(chosen) - r(rejected) (reward-model units)")
ax.set_ylabel("loss of one pair (nats)")
ax.set_title("Bradley-Terry loss of one pair")
plt.show()

# %% nbgrader={"grade": true, "grade_id": "test_seq_preference_loss", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_preference_loss: value and gradient of the Bradley-Terry loss on fresh pairs, including a margin of -120, a tie and float64 scores
### BEGIN HIDDEN TESTS
grading.judge("test_seq_preference_loss")
### END HIDDEN TESTS
assert abs(float(preference_loss(jnp.zeros(3), jnp.zeros(3))) - np.log(2.0)) < 1e-6, (
    "a zero margin costs log 2 = 0.6931 nats per pair")
assert np.isfinite(float(preference_loss(jnp.array([0.0]), jnp.array([200.0])))), (
    "a margin of -200 must give a finite loss (use softplus)")
