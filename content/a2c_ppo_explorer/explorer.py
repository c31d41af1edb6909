# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # a2c · PPO explorer: move β and ε, watch the run change
#
# This notebook has nothing to hand in. It runs the course's compiled PPO trainer (the same one as in
# the lesson: a three-action bandit, a frozen learned reward, a fixed reference policy) every time you
# move a slider, and redraws:
#
# * **Expected learned reward** after each rollout batch, with the reference's value (grey, dashed) and the
#   analytic optimum's value (red, dotted);
# * **KL to the reference** after each rollout batch, in nats, with the optimum's KL;
# * **Action probabilities**: reference, final PPO policy, and the analytic optimum
#   $\pi^*(a) \propto \pi_{\mathrm{ref}}(a)\,e^{r(a)/\beta}$.
#
# The line under the sliders gives the final expected reward, the final KL, the regularised objective
# $E_\pi[r] - \beta\,\mathrm{KL}(\pi\,\|\,\pi_{\mathrm{ref}})$ next to the optimum's value (and the gap), and the
# share of samples in the last batch whose ratio was clipped. The β×ε map underneath trains one policy per
# cell in a single vectorised call; the ring marks where your sliders are.
#
# Run the cell below (the first run compiles the trainer and the map: a few seconds).

# %% nbgrader={"grade": false, "grade_id": "explorer_show", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab.explorer import PPOExplorer

explorer = PPOExplorer()
explorer.show()

# %% [markdown]
# ## Things to try (predict first, then move the slider)
#
# 1. **β, the KL coefficient.** Before you drag β from 0.2 up to about 2, write down what you expect for
#    the final KL and for the final expected reward. Then check the readout. Which curve in the map does
#    the reward trade against?
# 2. **The gap to the optimum.** With the lesson's settings, the trained policy's objective sits a little
#    below the optimum's. Predict whether more rollouts (a longer run) or a larger learning rate closes the
#    gap faster, then try both.
# 3. **ε, the clip range.** Set ε very small (0.02) and look at the clipped share and at how quickly the
#    reward curve rises. Then make ε large (0.8). Which setting lets one batch move the policy further?
# 4. **Noise.** Change only the seed a few times. How much of what you saw in 1-3 is bigger than the
#    seed-to-seed wobble?
#
# Typing a value into a box and pressing Enter sets the slider exactly; a value PPO cannot use (β ≤ 0,
# ε outside (0, 1), a fractional batch size ...) is refused with a red message.

# %% [markdown]
# The numbers on screen are also available in Python, for example to paste into a report:

# %%
{k: v for k, v in explorer.last_summary.items()
 if k in ("params", "final_reward", "final_kl", "objective_trained", "objective_optimum", "gap", "clip_fraction")}
