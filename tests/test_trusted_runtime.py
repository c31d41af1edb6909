"""Gradients the notebook's own code cannot rewrite (rlhf_lab/instructor/grader/trusted_runtime.py).

A :class:`TrustedRuntime` is a fresh, sandboxed Python that captures ``jax.grad`` before any cell of
the notebook runs, then runs only the answer cells the requested function needs. These tests start
real runtimes (bubblewrap, as a grading kernel) on small notebooks and compare each gradient with
``jax.grad`` computed here, in the test process: a correct loss gets the true gradient, a loss that
forgets nothing but a cell that rebinds ``jax.grad`` or ``stop_gradient`` is refused with the cell
named, a NumPy loss JAX cannot trace fails with the reason, a test cell is never run, and a
gradient that never finishes fails on its timeout.
"""
from __future__ import annotations

import gc
import os
import time

import jax
import jax.numpy as jnp
import nbformat
import numpy as np
import pytest

from course_support import REPO, load_module
from rlhf_lab.judging.core import GradingError, Jax
from rlhf_lab.instructor.grader import trusted_runtime as tr

sandbox = load_module(REPO / "helpers/rlhf_lab/instructor/grader/sandbox.py", "rlhf_lab_course_sandbox")
pytestmark = [pytest.mark.slow,  # each test starts a sandboxed Python that imports JAX
              pytest.mark.skipif(sandbox.find_bwrap() is None, reason="bubblewrap (bwrap) is not installed")]

LOSS = """
import jax
import jax.numpy as jnp

def loss(x, w):
    return jnp.sum(jnp.tanh(x * w) ** 2) + 0.5 * jnp.sum(jax.lax.stop_gradient(w) * x)
"""


def cells(*sources, test_index=None):
    out = []
    for i, src in enumerate(sources):
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata["nbgrader"] = ({"grade": True, "solution": False, "grade_id": f"test_{i}", "locked": True}
                                     if i == test_index else {"grade": False, "solution": True,
                                                              "grade_id": f"answer_{i}", "locked": False})
        out.append(cell)
    return out


def expected(x, w):
    def loss(x, w):
        return jnp.sum(jnp.tanh(x * w) ** 2) + 0.5 * jnp.sum(jax.lax.stop_gradient(w) * x)

    return np.asarray(jax.grad(loss, argnums=1)(x, w))


@pytest.fixture
def run(tmp_path):
    made = []

    def start(*sources, timeout=60.0):
        runtime = tr.TrustedRuntime(cells(*sources, "pass"), str(tmp_path), timeout=timeout)
        runtime.upto = len(sources)  # the (last) test cell
        made.append(runtime)
        return runtime

    yield start
    for runtime in made:
        runtime.close()


X = np.array([0.3, -1.2, 2.0], np.float32)
W = np.array([1.5, 0.2, -0.7], np.float32)


def test_a_correct_loss_gets_the_true_gradient(run):
    runtime = run(LOSS)
    got = runtime.grad("loss", 1, Jax(X), Jax(W))
    np.testing.assert_allclose(np.asarray(got), expected(X, W), rtol=1e-6, atol=1e-7)
    again = runtime.grad("loss", 1, Jax(X), Jax(W * 2))  # the same process answers the next request
    np.testing.assert_allclose(np.asarray(again), expected(X, W * 2), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("attack", [
    "jax.grad = lambda f, argnums=0: (lambda *a, **k: jnp.zeros(3))",
    "jax.lax.stop_gradient = lambda v: v * 0.0",
    "import jax._src.api as _api\n_api.grad = lambda f, argnums=0: (lambda *a, **k: jnp.zeros(3))",
    "import builtins\nbuiltins.sum = lambda *a, **k: 0",
])
def test_a_cell_that_rewrites_jax_or_builtins_earns_nothing(run, attack):
    runtime = run(LOSS + "\n" + attack + "\n")
    with pytest.raises(GradingError, match="no points for this gradient test"):
        runtime.grad("loss", 1, Jax(X), Jax(W))


FINALIZER = """
import jax
import jax.numpy as jnp

SCALE = 1.0


class _Bomb:
    def __del__(self):
        jax.grad = lambda f, argnums=0: (lambda *a, **k: jnp.zeros(3))


_bomb = _Bomb()
_bomb.me = _bomb  # a cycle: only the garbage collector frees it
"""
SCALED_LOSS = """
def loss(x, w):
    return SCALE * (jnp.sum(jnp.tanh(x * w) ** 2) + 0.5 * jnp.sum(jax.lax.stop_gradient(w) * x))
"""


def test_a_finalizer_in_cyclic_garbage_never_runs_as_trusted_code(run):
    """A cycle whose ``__del__`` rewrites ``jax.grad``. Made garbage in the cell that built it, the
    collection after that cell runs the finalizer as that cell's code: its tampering is named. Made
    garbage in a later cell (the runtime collects only objects younger than the last cell, and never
    outside a cell), it may never be collected: the answer is then the true gradient. Either way the
    finalizer never runs as trusted code, so a forged gradient is never the answer."""
    same_cell = run(FINALIZER + "del _bomb\n" + SCALED_LOSS)
    with pytest.raises(GradingError, match="no points for this gradient test"):
        same_cell.grad("loss", 1, Jax(X), Jax(W))
    later_cell = run(FINALIZER, "del _bomb\n" + SCALED_LOSS)
    try:
        got = later_cell.grad("loss", 1, Jax(X), Jax(W))
    except GradingError as exc:
        assert "no points for this gradient test" in str(exc)
    else:
        np.testing.assert_allclose(np.asarray(got), expected(X, W), rtol=1e-6, atol=1e-7)


def test_a_numpy_loss_is_not_differentiated(run):
    runtime = run("import numpy as np\n\ndef loss(x, w):\n    return float(np.sum(np.tanh(np.asarray(x) * np.asarray(w)) ** 2))\n")
    with pytest.raises(GradingError, match="jax.grad could not differentiate your function"):
        runtime.grad("loss", 1, Jax(X), Jax(W))


def test_test_cells_and_cells_it_does_not_need_never_run(run, tmp_path):
    runtime = run(LOSS, "raise SystemExit('an unrelated cell')", "def other():\n    return 1\n")
    got = runtime.grad("loss", 1, Jax(X), Jax(W))
    np.testing.assert_allclose(np.asarray(got), expected(X, W), rtol=1e-6, atol=1e-7)
    assert tr.needed_cells(cells(LOSS, "import os\nos.remove('x')", "z = 1", "pass", test_index=3), 3, "loss") == [0]


def test_a_functions_own_locals_do_not_pull_in_cells_that_bind_the_same_names():
    """An experiment cell (a training run, say) that binds ``beta`` or ``margin`` at the top level is
    not needed by a function whose parameter or local has that name; globals it reads still are, also
    from nested functions, comprehensions and default values."""
    imports = "import jax\nimport jax.numpy as jnp\nSCALE = 2.0\n"
    experiment = "beta = 0.1\nmargin = jnp.zeros(3)\nrun = [beta * m for m in range(3)]\n"
    helper = "def helper(v):\n    return v * SCALE\n"
    answer = ("def dpo(logp, beta, k=SCALE):\n    margin = logp - 1.0\n"
              "    inner = lambda t: helper(t) * beta\n"
              "    return jnp.mean(jax.nn.softplus(-beta * margin)) + sum(inner(m) for m in [k])\n")
    nb = cells(imports, experiment, helper, answer, "pass", test_index=4)
    assert tr.needed_cells(nb, 4, "dpo") == [0, 2, 3]
    # a top-level read of an experiment's name still needs that cell
    reads = "scale_from_run = run[0]\ndef dpo(logp, beta):\n    return logp * scale_from_run\n"
    assert tr.needed_cells(cells(imports, experiment, reads, "pass", test_index=3), 3, "dpo") == [0, 1, 2]
    # a global read inside the function (not a local of it) needs the cell that binds it
    glob = "def dpo(logp):\n    return logp * margin\n"
    assert tr.needed_cells(cells(imports, experiment, glob, "pass", test_index=3), 3, "dpo") == [0, 1, 2]


def test_a_missing_function_is_named(run):
    runtime = run("x = 1\n")
    with pytest.raises(GradingError, match="`loss` is not defined"):
        runtime.grad("loss", 1, Jax(X), Jax(W))


def test_a_gradient_that_never_finishes_fails_on_the_timeout(run):
    runtime = run("import time\n\ndef loss(x, w):\n    while True:\n        time.sleep(0.05)\n", timeout=5.0)
    with pytest.raises(GradingError, match="not computed within 5 s"):
        runtime.grad("loss", 1, Jax(X), Jax(W))
    assert runtime.timed_out


def test_what_the_notebook_is_given_does_not_lead_to_the_runtime_globals(run):
    """get_ipython, display, the shell's class and sys.modules['__main__'] carry none of the runtime's
    globals (its pipe, the request's token): a loss that looks for them finds nothing."""
    runtime = run(LOSS + '''
import sys

def probe(x, w):
    places = [get_ipython.__globals__, display.__globals__, type(get_ipython()).__getattr__.__globals__,
              vars(sys.modules["__main__"])]
    leaks = [k for k in ("_token", "_OUT", "_send", "_write") for p in places if k in p]
    if leaks:
        raise RuntimeError("the runtime's globals are reachable: " + ", ".join(leaks))
    return loss(x, w)
''')
    got = runtime.grad("probe", 1, Jax(X), Jax(W))
    np.testing.assert_allclose(np.asarray(got), expected(X, W), rtol=1e-6, atol=1e-7)


def test_a_library_on_pythonpath_is_put_back_on_the_isolated_runners_path(monkeypatch, tmp_path):
    """``python -I`` ignores PYTHONPATH, where the hub's instructor server has the course library: the
    runner gets that folder on sys.path itself, and only that folder (nothing else of PYTHONPATH)."""
    import os
    import rlhf_lab

    parent = os.path.dirname(os.path.realpath(os.path.dirname(rlhf_lab.__file__)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), parent]))
    line = tr._library_path()
    assert line == f"import sys; sys.path.insert(0, {parent!r})\n"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert tr._library_path() == ""
    monkeypatch.delenv("PYTHONPATH")
    assert tr._library_path() == ""


def test_a_runtime_dropped_without_close_frees_its_process_and_folders(tmp_path):
    """A runtime nobody closed (its notebook's executor was dropped) releases, when it is collected,
    everything :meth:`close` releases: the process, its scratch folder and its compile-cache copy."""
    runtime = tr.TrustedRuntime(cells(LOSS, "pass", test_index=1), str(tmp_path), timeout=60.0)
    runtime.upto = 1
    runtime.grad("loss", 1, Jax(X), Jax(W))
    proc = runtime._proc
    scratch = runtime._scratch.root if runtime._scratch is not None else runtime._scratch_dir
    copy = tmp_path / "cache-copy"
    copy.mkdir()
    (copy / "entry").write_bytes(b"compiled")
    runtime._cache_copy = str(copy)
    assert proc.poll() is None and os.path.isdir(scratch)
    del runtime
    gc.collect()
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is not None, "the runtime's process outlived it"
    assert not os.path.exists(scratch), "its scratch folder was left behind"
    assert not copy.exists(), "its compile-cache copy was left behind"


def test_cells_prefetched_at_the_start_are_the_ones_the_first_check_runs(run):
    """The judge asks the runtime, when it starts, to run the cells of the notebook's first gradient
    check while the kernel runs the notebook (``prefetch``): the check then gets the same gradient,
    the same refusals and the same named failures as without it, and nothing is run twice."""
    runtime = run(LOSS, "def other():\n    return 1\n")
    runtime.start()
    assert runtime.prefetch(["loss"], 2)
    assert not runtime.prefetch(["loss"], 2)  # one request in flight at a time
    got = runtime.grad("loss", 1, Jax(X), Jax(W))
    np.testing.assert_allclose(np.asarray(got), expected(X, W), rtol=1e-6, atol=1e-7)
    assert runtime._ran == [0] and runtime.starts == 1

    rewritten = run(LOSS + "\njax.grad = lambda f, *a, **k: (lambda *x, **y: 0.0)\n")
    rewritten.start()
    assert rewritten.prefetch(["loss"], 1)
    with pytest.raises(GradingError, match="no points for this gradient test"):
        rewritten.grad("loss", 1, Jax(X), Jax(W))

    failing = run("import jax.numpy as jnp\nraise ValueError('broken cell')\ndef loss(x, w):\n    return jnp.sum(w)\n")
    failing.start()
    assert failing.prefetch(["loss"], 1)
    with pytest.raises(GradingError, match="broken cell"):
        failing.grad("loss", 1, Jax(X), Jax(W))


def test_prefetched_cells_that_never_finish_fail_the_check_on_its_timeout(run):
    """Prefetched cells are sent before the runtime has imported JAX; once it is ready they have the
    cell time, not the start-up allowance (120 s) on top of it: a notebook whose cell never ends is
    not held for two more minutes."""
    runtime = run("import time\nwhile True:\n    time.sleep(0.05)\n" + LOSS, timeout=5.0)
    runtime.start()
    assert runtime.prefetch(["loss"], 1)
    waits = []
    read = runtime._read
    runtime._read = lambda timeout: waits.append(timeout) or read(timeout)
    with pytest.raises(GradingError, match="not computed within 5 s"):
        runtime.grad("loss", 1, Jax(X), Jax(W))
    assert waits[0] == tr.START_TIMEOUT  # the ready line
    assert len(waits) == 2 and waits[1] <= 5.0, waits  # the prefetched cell (one): its cell time at most


def test_the_gradient_checks_name_their_functions_literally():
    """Prefetching needs the function a gradient check differentiates: every course check that asks
    for one (``student.grad``) names it with a literal. ``test_surrogate_gradients`` asks for none:
    only its message mentions ``jax.grad(...)``, which the text match of ``uses_grad`` counts."""
    from rlhf_lab.judging import CHECKS

    unnamed = [g for g in CHECKS if tr.uses_grad(g) and not tr.grad_names(g)]
    assert unnamed == ["test_surrogate_gradients"], unnamed
    assert tr.grad_names("test_seq_policy_loss") == ["policy_loss"]
