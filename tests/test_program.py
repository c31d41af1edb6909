"""Gradients from the program a function traces to (rlhf_lab/judging/program.py).

The kernel's side (:func:`rlhf_lab.judging.wire.trace`) turns a function into plain data; the judge's
side (:func:`rlhf_lab.judging.program.judge_gradient`) validates it, rebuilds it over the grader's own
JAX and differentiates it. These tests run both sides in this process (no kernel): every correct way
of writing a graded function gets ``jax.grad``'s gradient; custom derivative rules written in the
kernel are never used; and hostile program data (malformed, huge, deep, unknown primitives, a value
that is not the function's) fails the one check with a message, before anything large is made.
"""
from __future__ import annotations

import copy
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_lab.judging import program, wire
from rlhf_lab.judging.core import GradingError, Jax, LocalStudent
from rlhf_lab.judging.program import ProgramError

RNG = np.random.default_rng(7)
X = RNG.normal(size=5).astype(np.float32)
W = RNG.normal(size=5).astype(np.float32)
IDX = np.array([0, 3, 1, 4], np.int32)


def traced(fn, argnums, *args):
    """``(value, body)`` as the kernel would send them (through JSON text); arrays arrive as JAX arrays,
    as the checks' ``Jax`` markers deliver them."""
    live = [jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
    value, body = wire.trace(fn, argnums, live, {})
    return np.asarray(value), json.loads(json.dumps(body))


def rebuilt_grad(fn, argnums, *args):
    value, body = traced(fn, argnums, *args)
    return program.judge_gradient("f", value, body, args, argnums)


def loss_relu(x, w):
    return jnp.sum(jax.nn.relu(x * w) ** 2) + 0.5 * jnp.sum(jax.lax.stop_gradient(w) * x)


@jax.jit
def loss_jit(x, w):
    return jnp.mean(jnp.clip(x * w, -0.5, 0.5)) - jax.scipy.special.logsumexp(w)


def loss_vmap(x, w):
    return jnp.sum(jax.vmap(lambda a, b: jnp.where(a > 0, jax.nn.softplus(a * b), jnp.tanh(b)))(x, w))


def loss_gather_scatter(x, w):
    logp = jax.nn.log_softmax(w)
    picked = logp[IDX] + jnp.take_along_axis(logp[None, :], IDX[None, :], axis=1)[0]
    spread = jnp.zeros(5).at[IDX].add(x[: IDX.shape[0]])
    return -jnp.mean(picked * x[:4]) + jnp.sum(spread * w) + jnp.dot(x, w) + (jax.nn.one_hot(IDX, 5) @ w).sum()


def loss_loops(x, w):
    carry, _ = jax.lax.scan(lambda c, v: (0.9 * c + v, c), 0.0, x * w)
    looped = jax.lax.fori_loop(0, 5, lambda i, c: c + w[i] ** 2, 0.0)
    branch = jax.lax.cond(x[0] > 0, lambda: jnp.sum(w), lambda: jnp.prod(w))
    return carry + looped + branch + jnp.cumsum(w)[-1] + jnp.sort(w * x)[0] + jnp.std(w)


def loss_numpy_constants(x, w):
    return jnp.sum(x * w * np.arange(5.0, dtype=np.float32)) + jnp.sum(jnp.tile(w, (2, 1)))


@pytest.mark.parametrize("fn", [loss_relu, loss_jit, loss_vmap, loss_gather_scatter, loss_loops,
                                loss_numpy_constants], ids=lambda f: f.__name__)
@pytest.mark.parametrize("argnums", [0, 1, (0, 1)])
def test_every_way_of_writing_a_loss_gets_jax_grad_of_it(fn, argnums):
    got = rebuilt_grad(fn, argnums, X, W)
    want = jax.grad(fn, argnums)(jnp.asarray(X), jnp.asarray(W))
    for g, w in zip(got if isinstance(argnums, tuple) else [got], want if isinstance(argnums, tuple) else [want]):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-6)


def test_float64_with_x64_enabled_in_the_kernel():
    with jax.enable_x64(True):
        x, w = X.astype(np.float64), W.astype(np.float64)
        value, body = traced(lambda a, b: jnp.sum(jnp.log1p(jnp.exp(-a * b)) + jax.nn.log_sigmoid(b)), 1, x, w)
        want = jax.grad(lambda a, b: jnp.sum(jnp.log1p(jnp.exp(-a * b)) + jax.nn.log_sigmoid(b)), 1)(x, w)
    got = program.judge_gradient("f", value, body, (x, w), 1)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-12)


def test_a_detached_policy_term_is_graded_as_detached():
    """The classic mistake: the value is right, the gradient of the policy term is gone."""
    def detached(x, w):
        return jnp.sum(jnp.exp(jax.lax.stop_gradient(w) - 1.0) * x)

    np.testing.assert_allclose(rebuilt_grad(detached, 1, X, W), np.zeros(5), atol=0)


def test_a_custom_rule_written_in_the_kernel_is_never_used():
    """``jax.custom_jvp`` / ``custom_vjp`` whose rules lie (a zero gradient for exp): the kernel's own
    ``jax.grad`` believes them, the judge differentiates the primal program and does not."""
    @jax.custom_jvp
    def lying_exp(v):
        return jnp.exp(v)

    lying_exp.defjvp(lambda primals, tangents: (jnp.exp(primals[0]), jnp.zeros_like(tangents[0])))

    @jax.custom_vjp
    def lying_square(v):
        return v * v

    lying_square.defvjp(lambda v: (v * v, None), lambda _, g: (jnp.zeros_like(g),))

    def loss(x, w):
        return jnp.sum(lying_exp(w) * x) + jnp.sum(lying_square(w))

    assert np.all(np.asarray(jax.grad(loss, 1)(X, W)) == 0)  # what a kernel-side gradient would say
    np.testing.assert_allclose(rebuilt_grad(loss, 1, X, W), np.exp(W) * X + 2 * W, rtol=1e-5)


def test_a_random_key_in_the_program_is_refused_with_its_dtype():
    key = jax.random.key(0)
    with pytest.raises(ProgramError, match="unsupported dtype"):
        rebuilt_grad(lambda x, w: jnp.sum(w * x * jax.random.normal(key, (5,))), 1, X, W)


def test_numpy_code_is_untraceable_and_says_why():
    student = LocalStudent({"f": lambda x, w: float(np.sum(np.asarray(x) * np.asarray(w)))})
    with pytest.raises(GradingError, match="JAX could not trace it.*TracerArrayConversionError"):
        student.grad("f", 1, Jax(X), Jax(W))


@pytest.mark.parametrize("callback", ["pure", "io"])
def test_a_callback_is_named_with_what_to_write_instead(callback):
    def f(x, w):
        spec = jax.ShapeDtypeStruct((5,), jnp.float32)
        if callback == "pure":
            out = jax.pure_callback(lambda v: np.asarray(v) * 2, spec, w)
        else:
            out = jax.experimental.io_callback(lambda v: np.asarray(v) * 2, spec, w)
        return jnp.sum(out * x)

    import jax.experimental  # noqa: F401

    with pytest.raises(ProgramError, match=f"uses `{callback}_callback`.*jax.numpy operations"):
        rebuilt_grad(f, 1, X, W)


# ------------------------------------------------------------------------------------------------
# hostile program data (what a kernel could send instead)


def _body():
    return traced(loss_relu, 1, X, W)


def _first_eqn(body, name):
    return next(e for e in body["jaxprs"][0]["eqns"] if e[0] == name)


def _judge(value, body, **kw):
    return program.judge_gradient("clipped_kl_loss", value, body, (X, W), 1, **kw)


def test_the_negative_control_passes():
    value, body = _body()
    np.testing.assert_allclose(_judge(value, body), np.asarray(jax.grad(loss_relu, 1)(X, W)), rtol=1e-5)


def test_a_program_that_is_not_the_function_that_ran_fails_on_its_value():
    """A kernel that sends another function's program (here: one whose gradient is zero)."""
    value, _ = _body()
    _, other = traced(lambda x, w: jnp.sum(jax.lax.stop_gradient(w)) * 0.0 + 1.0, 1, X, W)
    with pytest.raises(GradingError, match="does not compute the value your function returned"):
        _judge(value, other)


def _mutations():
    def unknown(b):
        _first_eqn(b, "mul")[0] = "pure_callback"

    def sneaky_name(b):
        _first_eqn(b, "mul")[0] = "ada_correct <script>alert(1)</script>"

    def forward_ref(b):
        b["jaxprs"].append(copy.deepcopy(b["jaxprs"][0]))
        b["jaxprs"][1]["eqns"].append(["jit", [], [], {"jaxpr": 0}])

    def self_ref(b):
        b["jaxprs"][0]["eqns"].append(["jit", [], [], {"jaxpr": 0}])

    def undefined_var(b):
        b["jaxprs"][0]["eqns"][0][1] = [999]

    def redefined_var(b):
        e = b["jaxprs"][0]["eqns"]
        e[1][2] = copy.deepcopy(e[0][2])

    def object_dtype(b):
        b["jaxprs"][0]["in"][0][1] = "object"

    def huge_declared(b):
        b["jaxprs"][0]["in"][0][2] = [10 ** 9]

    def huge_broadcast(b):
        e = _first_eqn(b, "mul")
        e[0], e[3] = "broadcast_in_dim", {"shape": [1 << 40], "broadcast_dimensions": [], "sharding": None}
        e[1] = e[1][:1]

    def huge_iota(b):
        e = _first_eqn(b, "mul")
        e[0], e[1] = "iota", []
        e[3] = {"dtype": {"dtype": "float32"}, "shape": [1 << 16, 1 << 16], "dimension": 0, "sharding": None}

    def too_many_eqns(b):
        eqns = b["jaxprs"][0]["eqns"]
        eqns.extend([copy.deepcopy(eqns[-1]) for _ in range(5000)])

    def too_deep(b):
        for i in range(12):
            b["jaxprs"].append({"in": [], "const": [], "eqns": [["jit", [], [], {"jaxpr": i + 2}]], "out": []})
        b["jaxprs"][0]["eqns"].insert(0, ["jit", [], [], {"jaxpr": 1}])

    def long_scan(b):
        b["jaxprs"].append({"in": [], "const": [], "eqns": [], "out": []})
        b["jaxprs"][0]["eqns"].insert(0, ["scan", [], [], {"jaxpr": 1, "length": 10 ** 9, "num_consts": 0,
                                                         "num_carry": 0, "reverse": False}])

    def big_constant(b):
        b["consts"].append(wire.encode(np.zeros(1 << 21, np.float32)))

    def wrong_param(b):
        _first_eqn(b, "mul")[3] = {"__class__": {"opaque": "x"}}

    def not_a_dict(b):
        b["jaxprs"][0] = "eval('1')"

    def missing(b):
        b.clear()

    def pickled_const(b):
        b["consts"].append({"t": "nd", "dtype": "|O", "shape": [1], "data": ""})

    return {f.__name__: f for f in (unknown, sneaky_name, forward_ref, self_ref, undefined_var, redefined_var,
                                     object_dtype, huge_declared, huge_broadcast, huge_iota, too_many_eqns, too_deep,
                                     long_scan, big_constant, wrong_param, not_a_dict, missing, pickled_const)}


MUTATIONS = _mutations()


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_hostile_program_data_fails_the_check_with_a_message(name):
    value, body = _body()
    MUTATIONS[name](body)
    with pytest.raises(GradingError) as info:
        _judge(value, body)
    message = str(info.value)
    assert "<script>" not in message and len(message) < 700, message


def test_nan_constants_fail_as_a_wrong_value_not_as_a_crash():
    value, body = traced(lambda x, w: jnp.sum(w * jnp.asarray(np.ones(5, np.float32)) * x), 1, X, W)
    assert body["consts"], body
    body["consts"][0] = wire.encode(np.full(5, np.nan, np.float32))
    with pytest.raises(GradingError, match="does not compute the value"):
        _judge(value, body)


def test_a_while_loop_over_the_bound_is_stopped():
    """A loop the grader cannot see the end of (its bound here: 50 iterations, the loop runs 10**6) stops
    at the bound and fails the check; the same loop within the bound is evaluated."""
    def loop(n):
        return lambda x, w: jnp.sum(w * x) + 0.0 * jax.lax.while_loop(lambda c: c < n, lambda c: c + 1, 0)

    value, body = traced(loop(10 ** 6), 1, X, W)
    with pytest.raises(GradingError, match="while loop that ran more than 50 iterations"):
        _judge(value, body, limits=program.Limits(while_iterations=50))
    value, body = traced(loop(10), 0, X, W)
    np.testing.assert_allclose(program.judge_gradient("f", value, body, (X, W), 0,
                                                      limits=program.Limits(while_iterations=50)), W, rtol=1e-6)


def test_the_wire_refuses_a_program_over_its_bounds_before_parsing():
    value, body = _body()
    body["pad"] = "x" * (wire.MAX_PROGRAM_CHARS + 1)
    with pytest.raises(wire.TooLarge):
        wire.response(json.dumps({"ok": True, "value": wire.encode(value), "program": body}), program=True)
    deep = {"ok": True, "value": 1.0, "program": {"jaxprs": [[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]}}
    with pytest.raises(wire.TooLarge):
        wire.response(json.dumps(deep), program=True)


def test_every_primitive_of_the_courses_reference_losses_is_in_the_table():
    """The primitives the reference answers of the gradient checks trace to (a guard for a JAX
    upgrade that renames one)."""
    from rlhf_lab import ppo, reward
    import rlhf_lab.sequences as sq

    f32 = lambda *s: RNG.normal(size=s).astype(np.float32)  # noqa: E731
    cases = [(ppo.ppo_loss, (0, 1, 3), (f32(3), f32(6), IDX[:3].repeat(2) % 3, f32(6), f32(3))),
             (reward.preference_loss, 0, (f32(3), f32(5, 3), f32(5, 3))),
             (sq.masked_nll, 0, (f32(2, 5), np.ones((2, 5), np.float32))),
             (sq.policy_loss, (0, 1), (f32(2, 5), f32(2, 5), f32(2, 5), np.ones((2, 5), np.float32), 0.2)),
             (sq.dpo_loss, 0, (f32(4), f32(4), f32(4), f32(4), 0.1))]
    for fn, argnums, args in cases:
        value, body = traced(fn, argnums, *args)
        got = program.judge_gradient(fn.__name__, value, body, args, argnums)
        want = jax.grad(fn, argnums)(*args)
        for g, w in zip(got if isinstance(argnums, tuple) else [got], want if isinstance(argnums, tuple) else [want]):
            np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-6)
