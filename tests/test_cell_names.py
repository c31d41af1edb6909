"""Which answer cells a function needs (rlhf_lab/instructor/grader/cell_names.py): text only.

The authoring lint uses :func:`needed_cells` to find the answer cells no hidden check reads.
"""
from __future__ import annotations

import nbformat

from rlhf_lab.instructor.grader.cell_names import needed_cells


def cells(*sources, test_index=None):
    out = []
    for i, src in enumerate(sources):
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata["nbgrader"] = ({"grade": True, "solution": False, "grade_id": f"test_{i}", "locked": True}
                                     if i == test_index else {"grade": False, "solution": True,
                                                              "grade_id": f"answer_{i}", "locked": False})
        out.append(cell)
    return out


LOSS = "import jax\nimport jax.numpy as jnp\n\ndef loss(x, w):\n    return jnp.sum(jnp.tanh(x * w))\n"


def test_cells_the_function_does_not_need_and_test_cells_are_left_out():
    nb = cells(LOSS, "import os\nos.remove('x')", "z = 1", "pass", test_index=3)
    assert needed_cells(nb, 3, "loss") == [0]
    assert needed_cells(cells(LOSS, "loss = None", "pass", test_index=2), 2, "loss") == [1]  # rebound: the last binding counts


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
    assert needed_cells(nb, 4, "dpo") == [0, 2, 3]
    reads = "scale_from_run = run[0]\ndef dpo(logp, beta):\n    return logp * scale_from_run\n"
    assert needed_cells(cells(imports, experiment, reads, "pass", test_index=3), 3, "dpo") == [0, 1, 2]
    glob = "def dpo(logp):\n    return logp * margin\n"
    assert needed_cells(cells(imports, experiment, glob, "pass", test_index=3), 3, "dpo") == [0, 1, 2]
