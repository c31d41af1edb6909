"""The judge outside the kernel: the wire, and real kernels answering (or lying to) the grader.

* The wire carries plain data only: every value a check may receive round-trips exactly (0-d
  arrays, dtypes, nestings), and every malformed or hostile answer (an unknown node, an array whose
  bytes do not match its shape, an object dtype, text that is not JSON) is refused.
* With a real Jupyter kernel, the judge's checks pass a correct notebook and fail a wrong one with
  the check's message. What the kernel says about itself decides nothing: a kernel that rebinds
  the bridge to answer "ok" with a made-up value, prints a fake result, rebinds NumPy's comparison
  functions or returns an object whose ``__eq__`` is always true still gets only what its numbers
  earn. A function that never returns costs only that test (the kernel is interrupted), and a
  function that is not defined is named.
* Bounds on what the kernel sends back, checked before anything is parsed: the ``text/plain`` of a
  response must be one quoted literal of bounded length (:func:`wire.read_text`), its JSON is
  counted (nodes, depth) without being built (:func:`wire.scan`); the grader's own client of the
  kernel drops messages over a size before reading them (ZeroMQ's ``MAXMSGSIZE``) and the request
  then fails at once as too large, not on the deadline. A judged cell
  has ONE deadline for all of its requests, and the judge-server connection carries JSON of plain
  data only, bounded, never pickles.
"""
from __future__ import annotations

import base64
import contextlib
import json
import textwrap
import time

import numpy as np
import pytest

from rlhf_lab.instructor.grader import judge
from rlhf_lab.judging import CHECKS, wire
from rlhf_lab.judging.core import GradingError, Jax, Key, Source


# ------------------------------------------------------------------------------------------------
# the wire


@pytest.mark.parametrize("value", [None, True, 3, 2.5, float("nan"), "text", np.float32(1.5), np.array(2.0),
                                   np.arange(6, dtype=np.int32).reshape(2, 3), np.array([True, False]),
                                   (1, [2.0, np.ones(2)], {"a": np.zeros((0, 3))})])
def test_plain_values_round_trip_exactly(value):
    back = wire.decode(json.loads(json.dumps(wire.encode(value))))

    def same(a, b):
        if isinstance(a, (np.ndarray, np.generic)):
            b = np.asarray(b)
            return np.asarray(a).shape == b.shape and np.asarray(a).dtype == b.dtype and np.array_equal(
                np.asarray(a), b, equal_nan=True)
        if isinstance(a, (tuple, list)):
            return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, float) and np.isnan(a):
            return np.isnan(b)
        return a == b and type(a) is type(b)

    assert same(value, back)


class _Liar:
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("value", [_Liar(), lambda: 0, np.array(["a"]), {1: 2}, "x" * 20_000, object()])
def test_what_is_not_plain_data_is_refused_on_the_kernel_side(value):
    with pytest.raises(wire.Refused):
        wire.encode(value)


def _nd(arr):
    return wire.encode(np.asarray(arr))


@pytest.mark.parametrize("node", [
    {"t": "pickle", "v": "..."},
    {"t": "nd", "dtype": "|O", "shape": [1], "data": ""},
    {"t": "nd", "dtype": "<f4", "shape": [3], "data": base64.b64encode(b"\0" * 8).decode()},
    {"t": "nd", "dtype": "<f8", "shape": [1], "data": "not base64!"},
    {"t": "jax", "v": {"t": "nd", "dtype": "<f4", "shape": [], "data": base64.b64encode(b"\0" * 4).decode()}},
    {"t": "src", "source": "import os", "name": "f"},
    [1, 2],
])
def test_hostile_nodes_are_refused_on_the_judge_side(node):
    with pytest.raises((wire.Refused, ValueError, KeyError)):
        wire.decode(node)


def test_responses_that_are_not_verdicts_are_refused():
    for text in ("not json", json.dumps([1]), json.dumps({"ok": "yes"}), 42):
        with pytest.raises(wire.Refused):
            wire.response(text)
    assert wire.response(json.dumps({"ok": True, "value": _nd([1.0])}))[0] is True
    assert wire.response(json.dumps({"ok": False, "kind": "raised", "error": "E"})) == (False, ("raised", "E"))


def test_requests_carry_markers_and_the_bridge_builds_them():
    text = wire.request("call", "f", (Jax(np.ones(2, np.float32)), Key(7)),
                        {"g": Source("def g(x):\n    return x + 1\n", "g")})
    body = json.loads(text)
    assert [a["t"] for a in body["args"]] == ["jax", "key"] and body["kwargs"]["g"]["t"] == "src"
    live = [wire.decode(a, live=True) for a in body["args"]]
    import jax

    assert isinstance(live[0], jax.Array) and live[1].dtype == jax.random.key(0).dtype
    assert wire.decode(body["kwargs"]["g"], live=True)(1) == 2


# ------------------------------------------------------------------------------------------------
# real kernels


@pytest.fixture(scope="module")
def kernel():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        judge.install_bridge(kc)
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _run_in(kc, code: str) -> None:
    reply = kc.execute_interactive(textwrap.dedent(code), output_hook=lambda m: None, timeout=120)
    assert reply["content"]["status"] == "ok", reply["content"]


def _verdict(kernel, name: str, timeout: float = 60):
    km, kc = kernel
    student = judge.RemoteStudent(kc, CHECKS[name], timeout, interrupt=km.interrupt_kernel)
    out = judge.run_check(name, student)
    return None if not out else out[0]["evalue"]


CORRECT_SURROGATE = """
import jax.numpy as jnp
def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):
    ratio, advantage = jnp.asarray(ratio), jnp.asarray(advantage)
    if not clip:
        return ratio * advantage
    return jnp.minimum(ratio * advantage, jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * advantage)
"""


def test_a_correct_function_passes_and_a_wrong_one_is_told_why(kernel):
    _run_in(kernel[1], CORRECT_SURROGATE)
    assert _verdict(kernel, "test_ppo_surrogate") is None
    _run_in(kernel[1], """
    def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):
        ratio = jnp.asarray(ratio)
        return ratio * advantage if not clip else jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * advantage
    """)
    assert "dropped the signed min" in _verdict(kernel, "test_ppo_surrogate")


def test_rebinding_things_in_the_kernel_decides_nothing(kernel):
    _run_in(kernel[1], """
    import numpy as np, numpy.testing
    np.allclose = lambda *a, **k: True
    np.testing.assert_allclose = lambda *a, **k: None
    np.array_equal = lambda *a, **k: True
    def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):
        return jnp.asarray(ratio) * 0.0
    """)
    assert _verdict(kernel, "test_ppo_surrogate") is not None


def test_a_forged_bridge_answer_still_has_to_be_right(kernel):
    km, kc = kernel
    # the kernel replaces the grader's bridge with one that always answers "ok" with made-up numbers
    _run_in(kc, """
    import json, base64, numpy as _np
    def _rlhf_judge_bridge(request_text):
        arr = _np.ones(96, _np.float32)
        return json.dumps({"ok": True, "value": {"t": "nd", "dtype": arr.dtype.str, "shape": [96],
                                                 "data": base64.b64encode(arr.tobytes()).decode()}})
    print("[grader] test_ppo_surrogate: 6 / 6 points")
    """)
    try:
        assert _verdict(kernel, "test_ppo_surrogate") is not None
    finally:
        judge.install_bridge(kc)


DETACHED = """
import jax, jax.numpy as jnp
def loss(x, w):
    return jnp.sum(jnp.exp(jax.lax.stop_gradient(w)) * x) + jnp.sum(w ** 2)
"""
GX = np.array([0.5, -1.0, 2.0], np.float32)
GW = np.array([0.1, 0.7, -0.3], np.float32)
PLAIN = 2 * GW  # the detached loss's gradient w.r.t. w: only the square term
TRUE = np.exp(GW) * GX + 2 * GW  # what a forger wants the judge to see


def _kernel_grad(kernel):
    km, kc = kernel
    student = judge.RemoteStudent(kc, CHECKS["test_clipped_kl_loss"], 60, interrupt=km.interrupt_kernel)
    return student.grad("loss", 1, Jax(GX), Jax(GW))


@pytest.mark.parametrize("forgery", [
    # the rule of stop_gradient replaced in JAX's rule table (reached by names built at run time)
    """
    import importlib
    _ad = importlib.import_module("jax._src.interpreters." + "ad")
    _prims = importlib.import_module("jax.extend.core." + "primitives")
    _ad.primitive_jvps[_prims.stop_gradient_p] = lambda p, t: (p[0], t[0])
    """,
    # jax.grad and value_and_grad rebound, and the kernel's own frames walked to every global
    """
    import sys
    _real = jax.grad
    jax.grad = lambda f, argnums=0, **k: (lambda *a, **kw: _real(lambda *b: jnp.sum(b[1] ** 2) +
                                          jnp.sum(jnp.exp(b[1]) * b[0]), argnums)(*a, **kw))
    for _frame in [sys._getframe()]:
        while _frame is not None:
            _frame.f_globals.setdefault("grad", jax.grad)
            _frame = _frame.f_back
    """,
    # stop_gradient rebound for the names the judge might use, and sys.modules swapped
    """
    import sys, types
    _fake = types.ModuleType("jax")
    _fake.__dict__.update(jax.__dict__)
    _fake.grad = lambda f, argnums=0, **k: (lambda *a, **kw: jnp.ones(3))
    sys.modules["jax_forged"] = _fake
    """,
], ids=["rule_table", "grad_and_frames", "sys_modules"])
def test_gradient_forgeries_in_the_kernel_score_as_the_plain_mistake(kernel, forgery):
    """The judge differentiates the program the function traces to with its own JAX: whatever the
    kernel did to its own JAX, a detached loss gets the detached gradient (the plain mistake)."""
    _run_in(kernel[1], DETACHED)
    np.testing.assert_allclose(_kernel_grad(kernel), PLAIN, rtol=1e-6)  # the negative control
    _run_in(kernel[1], forgery)
    if "jax_forged" not in forgery:  # the forgery works in the kernel: its own jax.grad gives the forger's answer
        _run_in(kernel[1], f"assert jnp.allclose(jax.grad(loss, 1)(jnp.array({GX.tolist()}), "
                           f"jnp.array({GW.tolist()})), jnp.array({TRUE.tolist()}), rtol=1e-5)")
    try:
        np.testing.assert_allclose(_kernel_grad(kernel), PLAIN, rtol=1e-6)
    finally:
        kernel[0].restart_kernel(now=True)
        kernel[1].wait_for_ready(timeout=60)
        judge.install_bridge(kernel[1])


def test_a_patched_make_jaxpr_that_sends_another_program_fails_on_its_value(kernel):
    """A kernel whose ``jax.make_jaxpr`` traces another function (one with the gradient the forger
    wants but not the value that ran) fails: the rebuilt program's value is not the function's."""
    _run_in(kernel[1], DETACHED)
    _run_in(kernel[1], """
    _real_make_jaxpr = jax.make_jaxpr
    jax.make_jaxpr = lambda f, *a, **k: _real_make_jaxpr(lambda x, *r: jnp.sum(jnp.exp(x) * 1.5), *a, **k)
    """)
    try:
        with pytest.raises(GradingError, match="does not compute the value your function returned"):
            _kernel_grad(kernel)
    finally:
        _run_in(kernel[1], "jax.make_jaxpr = _real_make_jaxpr")


def test_a_program_over_the_wires_bounds_fails_its_check_alone(kernel):
    """A function closing over 8 MB of constants: its program is refused as too large, named, and
    the kernel answers the next request."""
    _run_in(kernel[1], """
    import numpy as np
    _big = np.ones(2_000_000, np.float32)
    def loss(x, w):
        return jnp.sum(w * x) + 0.0 * jnp.sum(jnp.asarray(_big))
    """)
    with pytest.raises(GradingError, match="grader reads at most|over 1,048,576 bytes"):
        _kernel_grad(kernel)
    _run_in(kernel[1], DETACHED)
    np.testing.assert_allclose(_kernel_grad(kernel), PLAIN, rtol=1e-6)


def test_an_object_that_equals_everything_is_refused(kernel):
    _run_in(kernel[1], """
    class Anything:
        def __eq__(self, other): return True
        def __bool__(self): return True
        def __array__(self, *a, **k): raise TypeError("no")
    def penalized_reward(reward, beta, kl):
        return Anything()
    """)
    message = _verdict(kernel, "test_penalized_reward")
    assert message and "expected numbers or arrays" in message and "Anything" in message


def test_a_missing_function_is_named(kernel):
    _run_in(kernel[1], "globals().pop('beta_sweep', None)")
    assert "`beta_sweep` is not defined" in _verdict(kernel, "test_beta_sweep")


def test_a_function_that_never_returns_costs_only_its_test(kernel):
    _run_in(kernel[1], """
    import time
    def penalized_reward(reward, beta, kl):
        while True:
            time.sleep(0.05)
    """)
    message = _verdict(kernel, "test_penalized_reward", timeout=3)
    assert "this whole test took longer than the per-cell timeout of 3 s" in message
    # the kernel was interrupted and answers the next request
    _run_in(kernel[1], "def penalized_reward(reward, beta, kl):\n    return reward - beta * kl\n")
    assert _verdict(kernel, "test_penalized_reward") is None


def test_judged_cells_are_recognised_only_in_test_cells():
    test = {"cell_type": "code", "metadata": {"nbgrader": {"grade": True, "solution": False}},
            "source": '# t: x\n### BEGIN HIDDEN TESTS\ngrading.judge("test_loop")\n### END HIDDEN TESTS\nassert 1\n'}
    assert judge.judged_check(test) == "test_loop"
    answer = dict(test, metadata={"nbgrader": {"grade": False, "solution": True}})
    assert judge.judged_check(answer) is None
    extra = dict(test, source=test["source"].replace('("test_loop")', '("test_loop")\nimport os'))
    assert judge.judged_check(extra) is None


# ------------------------------------------------------------------------------------------------
# bounds, checked before anything is parsed


@pytest.mark.parametrize("literal", ["'ok'", '"it\'s"', r"'a\nb'", r"'\x00\xe9'"])
def test_read_text_reads_what_repr_writes(literal):
    import ast

    assert wire.read_text(literal) == ast.literal_eval(literal)
    text = "\x00\n'\"é\U0001F600"
    assert wire.read_text(repr(text)) == text


@pytest.mark.parametrize("literal", ["'a' 'b'", "b'x'", "f'{1}'", "'''x'''", "('x')", "'x", "x", r"'\q'", 3, None,
                                     r"'\U99999999'"])
def test_read_text_refuses_anything_but_one_plain_literal(literal):
    with pytest.raises(wire.Refused):
        wire.read_text(literal)


def test_a_long_answer_is_refused_by_its_length_alone():
    literal = "'" + "a" * (wire.MAX_LITERAL_CHARS + 1) + "'"
    with pytest.raises(wire.TooLarge, match="characters long"):
        wire.read_text(literal)
    with pytest.raises(wire.TooLarge, match="characters long"):
        wire.response(json.dumps({"ok": True, "value": "x" * wire.MAX_RESPONSE_CHARS}))


def test_scan_counts_nodes_and_depth_outside_strings_only():
    # counted: each opening bracket and comma outside strings, plus one (an upper bound of the values)
    wire.scan('["[[[[[[[[[[", {"k": ",,,,,,,,,,,,,"}]', max_nodes=4, max_depth=2)
    with pytest.raises(wire.TooLarge, match="nested more than 3"):
        wire.scan("[[[[1]]]]", max_nodes=100, max_depth=3)
    with pytest.raises(wire.TooLarge, match="more than 4 values"):
        wire.scan("[1, 2, 3, 4, 5]", max_nodes=4, max_depth=3)
    deep = "[" * 50 + "]" * 50
    with pytest.raises(wire.TooLarge):
        wire.response(json.dumps({"ok": True, "value": json.loads(deep)}))
    many = {"ok": True, "value": {"t": "list", "v": [None] * (wire.MAX_RESPONSE_NODES + 1)}}
    with pytest.raises(wire.TooLarge):
        wire.response(json.dumps(many))


def test_link_messages_round_trip_and_refuse_anything_else():
    message = ("ask", "call", (Jax(np.arange(3.0, dtype=np.float32)), Key(7), 0.5, [1, 2]), {"beta": 0.1})
    kind, method, args, kwargs = judge.link_decode(judge.link_encode(message))
    assert (kind, method, kwargs) == ("ask", "call", {"beta": 0.1})
    assert isinstance(args[0], Jax) and np.array_equal(np.asarray(args[0].value), np.arange(3.0, dtype=np.float32))
    assert isinstance(args[1], Key) and args[1].seed == 7 and args[2:] == (0.5, [1, 2])
    assert judge.link_decode(judge.link_encode(("verdict", None))) == ("verdict", None)
    for bad in (b"\x80\x04K\x01.", b'{"ok": 1}', b'["ask", "call"]', b'["other", {"x": 1}]',
                b"[" * 200 + b"]" * 200):
        with pytest.raises((ValueError, wire.Refused)):
            judge.link_decode(bad)
    with pytest.raises(wire.TooLarge):
        judge.link_decode(b"[" + b"0," * judge.LINK_MAX_BYTES + b"0]")


def test_one_deadline_covers_all_the_requests_of_a_cell(kernel):
    """Each call takes 1 s, under the 2.5 s timeout, but the cell's third call is past its deadline."""
    from rlhf_lab.judging.core import GradingError

    km, kc = kernel
    _run_in(kc, """
    import time
    def slow_identity(x):
        time.sleep(1.0)
        return x
    """)
    student = judge.RemoteStudent(kc, CHECKS["test_penalized_reward"], 2.5, interrupt=km.interrupt_kernel)
    assert student.call("slow_identity", 1.0) == 1.0
    assert student.call("slow_identity", 2.0) == 2.0
    with pytest.raises(GradingError, match="this whole test took longer than the per-cell timeout of 2.5 s"):
        student.call("slow_identity", 3.0)
    assert student.expired
    time.sleep(1.5)  # the interrupted (or finished) call is over; the kernel answers again
    _run_in(kc, "x = 1")


@contextlib.contextmanager
def _bounded_client(km):
    """A client of ``km``'s kernel like the grader's own (:func:`judge.bounded_context`), closed after."""
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(context=judge.bounded_context())
    client.load_connection_info(km.get_connection_info())
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield client
    finally:
        _close(client)


def _close(client):
    judge.close_shell_monitor(client)
    client.stop_channels()
    client.context.destroy(linger=0)


def test_a_huge_answer_never_reaches_the_parser(kernel):
    """A forged bridge answering 8 MB: refused by its length by a plain client, dropped unread by the
    grader's bounded client (the request fails at once as too large); the kernel still answers."""
    from rlhf_lab.judging.core import GradingError

    km, kc = kernel
    _run_in(kc, """
    def _rlhf_judge_bridge(request_text):
        return "[" * 4_000_000 + "]" * 4_000_000
    """)
    try:
        message = _verdict(kernel, "test_penalized_reward", timeout=20)
        assert message and "characters long" in message, message
        with _bounded_client(km) as bounded:
            student = judge.RemoteStudent(bounded, CHECKS["test_penalized_reward"], 600)
            with pytest.raises(GradingError, match="over 1,048,576 bytes, the grader's bound"):
                student.call("penalized_reward", 1.0, 0.1, 0.5)
            assert student.client_broken and not student.expired
    finally:
        judge.install_bridge(kc)
    _run_in(kc, "x = 1")


def test_an_oversized_answer_fails_its_cell_as_too_large_and_the_next_student_is_graded(kernel):
    """A 20 MB answer (the bridge forged by the notebook) under a per-cell timeout of 10 minutes: the
    cell scores zero with the too-large message, not the deadline's; the same kernel, its bridge put
    back and the function right (the next student), passes through a new client as the grader makes."""
    km, kc = kernel
    _run_in(kc, "_rlhf_judge_bridge = lambda text: 'x' * 20_000_000")
    try:
        with _bounded_client(km) as bounded:
            student = judge.RemoteStudent(bounded, CHECKS["test_penalized_reward"], 600,
                                          interrupt=km.interrupt_kernel, alive=km.is_alive)
            out = judge.run_check("test_penalized_reward", student)
        assert len(out) == 1 and out[0]["ename"] == judge.FAILED
        message = out[0]["evalue"]
        assert "your code's answer to the grader was over 1,048,576 bytes" in message, message
        assert "per-cell timeout" not in message and not student.expired and student.client_broken
    finally:
        judge.install_bridge(kc)
    _run_in(kc, "def penalized_reward(reward, beta, kl):\n    return reward - beta * kl\n")
    with _bounded_client(km) as bounded:
        student = judge.RemoteStudent(bounded, CHECKS["test_penalized_reward"], 600, alive=km.is_alive)
        assert judge.run_check("test_penalized_reward", student) == []
        assert not student.client_broken


def test_a_kernel_that_dies_during_a_request_is_gone_not_too_large():
    """The kernel exits in the middle of a request: its client is disconnected as with a refused
    reply, but the kernel process is gone, and that is what the grader says."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        judge.install_bridge(kc)
        _run_in(kc, "import os\n_rlhf_judge_bridge = lambda text: os._exit(3)")
        with _bounded_client(km) as bounded:
            student = judge.RemoteStudent(bounded, CHECKS["test_penalized_reward"], 600, alive=km.is_alive)
            with pytest.raises((judge.KernelGone, Exception)) as info:
                student.call("penalized_reward", 1.0, 0.1, 0.5)
            assert isinstance(info.value, judge.KernelGone), info.value
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_client_connected_in_the_background_is_handed_over_ready(kernel):
    """The judge connects its client while the notebook's first cells run (``PendingClient``): the
    judged cell takes a client that answers, and installs the bridge on it as before."""
    km, _ = kernel
    pending = judge.PendingClient(km.get_connection_info(), 30)
    client = pending.take(30)
    assert client is not None
    try:
        judge.install_bridge(client, 30)
        _run_in(client, "def penalized_reward(reward, beta, kl):\n    return reward - beta * kl\n")
        student = judge.RemoteStudent(client, CHECKS["test_penalized_reward"], 60, alive=km.is_alive)
        assert judge.run_check("test_penalized_reward", student) == []
    finally:
        judge.close_client(client)
    assert pending.take(0) is None  # handed over once


def test_a_discarded_background_client_is_closed_and_a_failed_one_is_none(kernel):
    km, _ = kernel
    pending = judge.PendingClient(km.get_connection_info(), 30)
    pending._thread.join(30)
    made = pending._client
    assert made is not None and made.channels_running
    pending.discard()
    assert not made.channels_running and pending.take(0) is None

    # a kernel that is not there: the thread gives up within its timeout and take() says None,
    # so the judged cell connects again and reports the dead kernel itself
    info = dict(km.get_connection_info())
    info.update(shell_port=1, iopub_port=2, stdin_port=3, control_port=4, hb_port=5)
    gone = judge.PendingClient(info, 1.0)
    assert gone.take(30) is None
