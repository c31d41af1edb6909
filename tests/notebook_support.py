"""Running the source notebooks of an assignment in a kernel, as its notebook tests do.

Imported by ``tests/test_source_*.py`` (not a conftest). One kernel per notebook serves every run of
that notebook (``%reset -f`` before each run), so JAX's compile caches stay warm:

* :class:`NotebookKernel` and the module-scoped fixture :func:`run_variant`;
* :func:`release_stubs` (the notebook as students receive it, hidden tests kept) and
  :func:`hidden_only` (each test cell reduced to its hidden region: what decides the grade, since
  the judge decides test cells from their hidden region during autograding);
* :func:`check_recipe_run`: a mistake recipe fails exactly its target tests with its messages.
"""
from __future__ import annotations

import copy
import os

import nbformat
import pytest


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def grade_id(cell) -> str | None:
    return nbgrader_meta(cell).get("grade_id")


def is_test(cell) -> bool:
    meta = nbgrader_meta(cell)
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def graded_test_ids(nb) -> list[str]:
    return [grade_id(c) for c in nb.cells if is_test(c)]


class NotebookKernel:
    """One kernel for all runs of one notebook: each run resets the namespace, then runs every cell."""

    def __init__(self):
        from jupyter_client import KernelManager

        self.km = KernelManager(kernel_name="python3")
        # NBGRADER_EXECUTION makes the notebooks behave as under autograding (explorers are skipped).
        self.km.start_kernel(env={**os.environ, "NBGRADER_EXECUTION": "autograde", "JAX_PLATFORMS": "cpu"})

    def run(self, nb):
        from nbclient import NotebookClient

        nb = copy.deepcopy(nb)
        nb.cells.insert(0, nbformat.v4.new_code_cell("%reset -f", id="reset-namespace"))
        client = NotebookClient(nb, km=self.km, timeout=600, allow_errors=True, kernel_name="python3")
        try:
            client.execute()
        finally:
            if client.kc is not None:
                client.kc.stop_channels()
        nb.cells.pop(0)
        return nb

    def close(self):
        self.km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def run_variant():
    """``run_variant(name, key, make)`` executes ``make()`` once per key, in the kernel of ``name``."""
    kernels: dict[str, NotebookKernel] = {}
    results: dict[tuple[str, str], nbformat.NotebookNode] = {}

    def run(name, key, make):
        if (name, key) not in results:
            if name not in kernels:
                kernels[name] = NotebookKernel()
            results[(name, key)] = kernels[name].run(make())
        return results[(name, key)]

    try:
        yield run
    finally:
        for kernel in kernels.values():
            kernel.close()


def errors(cell) -> list[str]:
    return [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]


def stderr(cell) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr")


def by_id(nb) -> dict:
    return {grade_id(c) or c.id: c for c in nb.cells}


def release_stubs(nb):
    """The notebook as a student receives it (nbgrader's ClearSolutions), hidden tests kept in place."""
    from nbgrader.preprocessors import ClearSolutions

    stubbed, _ = ClearSolutions().preprocess(copy.deepcopy(nb), {})
    return stubbed


def hidden_only(nb):
    """Test cells reduced to their comment line and hidden region (what the judge decides from)."""
    out = copy.deepcopy(nb)
    for cell in out.cells:
        if is_test(cell):
            cell.source = cell.source.split("### END HIDDEN TESTS")[0] + "### END HIDDEN TESTS\n"
    return out


def solution_problems(executed) -> dict:
    """``{cell: [errors]}`` of an executed notebook whose solutions should pass every cell, stderr included."""
    problems = {}
    for cell in executed.cells:
        if cell.cell_type != "code":
            continue
        if errors(cell):
            problems[grade_id(cell) or cell.id] = errors(cell)
        elif is_test(cell) and stderr(cell):
            problems[grade_id(cell)] = ["wrote to stderr: " + stderr(cell)[:300]]
    return problems


def check_recipe_run(key: str, recipe: dict, part: str, executed) -> None:
    """A recipe's run fails its target tests with their messages; hidden-only, every other test passes.

    In a full run (visible checks too, as a student runs the notebook) other visible checks may fail
    as well when they use the student's own broken work; the grade is the hidden-only outcome.
    """
    cells = by_id(executed)
    for test_id in graded_test_ids(executed):
        found = errors(cells[test_id])
        if test_id in recipe["fails"]:
            assert found, f"{key}: {test_id} should fail but passed"
            expected = recipe["fails"][test_id]
            if expected is not None:
                assert any(expected in e for e in found), f"{key}: {test_id} failed with {found}, expected {expected!r}"
        elif part == "hidden-only":
            assert not found, f"{key}: {test_id} should still pass but failed with {found}"
