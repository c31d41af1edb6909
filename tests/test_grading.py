"""Delegation detection of ``rlhf_lab.grading.call``, in-process (no nbgrader, no kernel).

A hidden test calls a student's function through ``grading.call(fn, ..., task=..., forbid=...)``.
The call must fail with the "must be implemented, not delegated" message whenever a forbidden
library function does the work, however it is reached (alias, wrapper, jitted wrapper whose trace
is already cached, closure, default argument, partial, container, callable object, an import in
the body, a name built at run time), and must let honest code through, including code that uses
library functions the task allows.
"""
from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rlhf_lab
import rlhf_lab.ppo
from rlhf_lab import grading
from rlhf_lab.ppo import clipped_surrogate as _aliased_surrogate

grading.start()

RATIO = jnp.array([0.5, 1.0, 1.5, 2.0])
ADV = jnp.array([1.0, -1.0, 2.0, -2.0])
WANT = np.minimum(np.asarray(RATIO) * np.asarray(ADV), np.clip(np.asarray(RATIO), 0.8, 1.2) * np.asarray(ADV))


def honest(ratio, adv, eps):
    return jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - eps, 1 + eps) * adv)


def thin_wrapper(ratio, adv, eps):
    return rlhf_lab.ppo.clipped_surrogate(ratio, adv, eps)


def calls_alias(ratio, adv, eps):
    return _aliased_surrogate(ratio, adv, eps)


def imports_in_body(ratio, adv, eps):
    from rlhf_lab.ppo import clipped_surrogate
    return clipped_surrogate(ratio, adv, eps)


def calls_a_helper(ratio, adv, eps):
    return _helper(ratio, adv, eps)


def _helper(ratio, adv, eps):
    return thin_wrapper(ratio, adv, eps)


def default_argument(ratio, adv, eps, _impl=rlhf_lab.clipped_surrogate):
    return _impl(ratio, adv, eps)


def make_closure():
    impl = rlhf_lab.ppo.clipped_surrogate

    def inner(ratio, adv, eps):
        return impl(ratio, adv, eps)
    return inner


_TABLE = {"surrogate": rlhf_lab.ppo.clipped_surrogate}


def from_a_container(ratio, adv, eps):
    return _TABLE["surrogate"](ratio, adv, eps)


class _Callable:
    def __init__(self):
        self.impl = rlhf_lab.ppo.clipped_surrogate

    def __call__(self, ratio, adv, eps):
        return self.impl(ratio, adv, eps)


_Callable.__module__ = "__main__"  # as if defined in a notebook


def name_built_at_run_time(ratio, adv, eps):
    module = importlib.import_module("rlhf_lab." + "ppo")
    return getattr(module, "clipped_" + "surrogate")(ratio, adv, eps)


class _Holder:
    clipped_surrogate = staticmethod(honest)


def uses_allowed_library_code(ratio, adv, eps):
    """Same attribute name as the forbidden function, on an object that is not the library."""
    kl = rlhf_lab.ppo.categorical_kl(jnp.log(jnp.array([0.5, 0.5])), jnp.log(jnp.array([0.5, 0.5])))
    return _Holder.clipped_surrogate(ratio, adv, eps) + kl


DELEGATING = {
    "alias imported at the top": _aliased_surrogate,
    "thin wrapper": thin_wrapper,
    "wrapper calling an alias": calls_alias,
    "import inside the function": imports_in_body,
    "helper function calling a wrapper": calls_a_helper,
    "default argument": default_argument,
    "closure": make_closure(),
    "dict of functions": from_a_container,
    "functools.partial": functools.partial(rlhf_lab.ppo.clipped_surrogate, eps=0.2),
    "callable object": _Callable(),
    "jax.jit of a wrapper": jax.jit(thin_wrapper),
    "name built at run time": name_built_at_run_time,
}


def _call(fn):
    return grading.call(fn, RATIO, ADV, eps=0.2, task="ppo_surrogate", forbid=("clipped_surrogate",))


@pytest.mark.parametrize("how", sorted(DELEGATING))
def test_delegation_is_caught(how):
    """each way of handing the task to the library is reported as delegation"""
    fn = DELEGATING[how]
    with pytest.raises(grading.GradingError, match="must be implemented, not delegated.*clipped_surrogate"):
        _call(fn)


def test_jitted_wrapper_with_a_cached_trace_is_caught():
    """a jitted wrapper already run on the test's shapes runs no Python on the next call; still caught"""
    warmed = jax.jit(lambda r, a, e: rlhf_lab.ppo.clipped_surrogate(r, a, e))
    warmed(RATIO, ADV, 0.2).block_until_ready()  # the trace is now cached for these shapes
    with pytest.raises(grading.GradingError, match="is used by your function"):
        _call(warmed)


def test_name_built_at_run_time_is_caught_by_the_profile_hook():
    """getattr with a computed name escapes the static reading; the call itself reveals it"""
    with pytest.raises(grading.GradingError, match="ran inside your function"):
        _call(name_built_at_run_time)


@pytest.mark.parametrize("fn", [honest, jax.jit(honest), uses_allowed_library_code], ids=["plain", "jitted", "allowed"])
def test_honest_code_passes(fn):
    """own code passes, jitted or not, and so does a library function the task allows"""
    np.testing.assert_allclose(_call(fn), WANT, rtol=1e-6)


def test_everything_forbidden_with_star():
    """forbid=('*',) forbids every library function, including ones the task did not name"""
    with pytest.raises(grading.GradingError, match="categorical_kl"):
        grading.call(uses_allowed_library_code, RATIO, ADV, eps=0.2, task="t", forbid=("*",))


def test_jitted_student_loop_is_not_unrolled():
    """grading.call keeps JIT on: a scan of 2,000 steps compiles once instead of running 2,000 Python steps"""
    traces = []

    @jax.jit
    def loop(x):
        def body(carry, _):
            traces.append(1)
            return carry * 0.999 + 0.001, None
        return jax.lax.scan(body, x, None, length=2000)[0]

    out = grading.call(loop, jnp.ones(3), task="loop", forbid=("*",))
    assert out.shape == (3,)
    assert len(traces) == 1, f"the scan body ran {len(traces)} times in Python (JIT was disabled)"


def table_with_default(ratios, advs, eps, surrogate=_aliased_surrogate):
    return surrogate(ratios, advs, eps)


def test_a_default_the_test_replaces_is_not_delegation():
    """a later task that takes the earlier function as a default argument is judged on what the test passes"""
    np.testing.assert_allclose(grading.call(table_with_default, RATIO, ADV, 0.2, surrogate=honest,
                                            task="t", forbid=("clipped_surrogate",)), WANT, rtol=1e-6)
    with pytest.raises(grading.GradingError, match="not delegated"):
        grading.call(table_with_default, RATIO, ADV, 0.2, task="t", forbid=("clipped_surrogate",))
