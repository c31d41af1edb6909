"""Statements that rebind JAX, NumPy, builtins or the course library (``rlhf_lab/instructor/grader/rebinding.py``).

Fast tests only: :func:`rebinding.scan` / :func:`rebinding.scan_cells` on every reported and every
allowed form (nothing runs: the cells are parsed), and the real pre-flight
(:func:`rlhf_lab.instructor.grader.integrity.preflight`) on a copy of the course (``nbgrader_config.py``
and ``release/``) with a correct ``a1_ppo_objective`` submission, once clean and once with
``jax.grad`` rebound in an answer cell of ``01_clipped_objective``: the second gets one
``rebinding`` BLOCK finding that withholds exactly the test cells at or below that cell. No code
cell of the course's own ``source/`` notebooks is reported.
"""
from __future__ import annotations

import copy
import shutil

import nbformat
import pytest
from course_support import REPO, correct_submission, write_submissions

from rlhf_lab.instructor.grader import integrity, rebinding
from rlhf_lab.instructor.grader.rebinding import INTROSPECTION, REBIND, Rebinding, scan, scan_cells

IMPORTS = ("import jax\nimport jax.numpy as jnp\nimport numpy as np\nimport builtins\nimport sys\n"
           "import importlib\nimport optax\nfrom jax import lax\nfrom jax import numpy as xp\n"
           "from rlhf_lab import ppo\nimport rlhf_lab.sequences as S\nimport inspect, gc, threading, ctypes\n")
FIRST = IMPORTS.count("\n") + 1  # the line of the statement after IMPORTS


def one(code: str) -> Rebinding:
    """The single hit of ``code`` after :data:`IMPORTS` (asserting there is exactly one)."""
    hits = scan(IMPORTS + code)
    assert len(hits) == 1, hits
    return hits[0]


# --------------------------------------------------------------------------------- reported: rebind
@pytest.mark.parametrize("code, target", [
    ("jax.grad = f", "jax.grad"),
    ("jnp.sum = f", "jax.numpy.sum"),
    ("np.random.seed = f", "numpy.random.seed"),
    ("jax.lax.stop_gradient = f", "jax.lax.stop_gradient"),
    ("lax.stop_gradient = f", "jax.lax.stop_gradient"),
    ("xp.mean = f", "jax.numpy.mean"),
    ("S.masked_nll = f", "rlhf_lab.sequences.masked_nll"),
    ("optax.adam = f", "optax.adam"),
    ("del jax.grad", "jax.grad"),
    ("jax.grad += f", "jax.grad"),
    ("jax.grad: object = f", "jax.grad"),
    ("ppo.clipped_surrogate = f", "rlhf_lab.ppo.clipped_surrogate"),
    ("builtins.print = f", "builtins.print"),
    ('__builtins__["len"] = f', "builtins.len"),
    ("__builtins__.len = f", "builtins.len"),
    ('sys.modules["jax"] = m', "sys.modules['jax']"),
    ('del sys.modules["jax"]', "sys.modules['jax']"),
    ('setattr(jax, "grad", f)', "jax.grad"),
    ('setattr(np.testing, "assert_" + "allclose", f)', "numpy.testing.*"),
    ('delattr(jnp, "sum")', "jax.numpy.sum"),
    ('vars(np)["sum"] = f', "numpy.sum"),
    ('jax.__dict__["grad"] = f', "jax.grad"),
    ("jax.__dict__.update(grad=f)", "jax.__dict__.update"),
    ('object.__setattr__(jax, "grad", f)', "jax.grad"),
    ('jax.__setattr__("grad", f)', "jax.grad"),
    ('sys.modules.__setitem__("jax", m)', "sys.modules.__setitem__"),
    ("sys.modules.update(jax=m)", "sys.modules.update"),
    ('getattr(np, "testing").assert_allclose = f', "numpy.testing.assert_allclose"),
    ('__import__("numpy").sum = f', "numpy.sum"),
    ("f.__code__ = g.__code__", "f.__code__"),
    ("f.__globals__ = {}", "f.__globals__"),
    ("f.__defaults__ = (1,)", "f.__defaults__"),
    ("f.__kwdefaults__ = {}", "f.__kwdefaults__"),
    ("x.__class__ = Y", "x.__class__"),
    ('setattr(f, "__code__", g.__code__)', "f.__code__"),
    ("importlib.reload(jax)", "importlib.reload"),
    ("G = ppo\nG.clipped_surrogate = f", "rlhf_lab.ppo.clipped_surrogate"),
    ("def patch():\n    jax.grad = f", "jax.grad"),
    ('exec("jax.grad = f")', "jax.grad"),
])
def test_each_rebinding_form_is_reported_with_its_line_and_target(code, target):
    hit = one(code)
    assert (hit.line, hit.target, hit.kind) == (FIRST + code.count("\n"), target, REBIND), hit
    assert hit.text == code.splitlines()[-1].strip()


# -------------------------------------------------------------------------- reported: introspection
@pytest.mark.parametrize("code, target", [
    ("frame = exc.__traceback__.tb_frame", "exc.__traceback__.tb_frame"),
    ("up = frame.f_back", "frame.f_back"),
    ("frame.f_locals['x'] = 1", "frame.f_locals"),
    ("g = frame.f_globals", "frame.f_globals"),
    ("b = frame.f_builtins", "frame.f_builtins"),
    ("fr = gen.gi_frame", "gen.gi_frame"),
    ("fr = coro.cr_frame", "coro.cr_frame"),
    ("fr = agen.ag_frame", "agen.ag_frame"),
    ("sys._getframe(1)", "sys._getframe"),
    ("inspect.currentframe()", "inspect.currentframe"),
    ("inspect.stack()", "inspect.stack"),
    ("gc.get_objects()", "gc.get_objects"),
    ("gc.get_referrers(jax.grad)", "gc.get_referrers"),
    ("gc.get_referents(x)", "gc.get_referents"),
    ("sys.settrace(tracer)", "sys.settrace"),
    ("sys.setprofile(tracer)", "sys.setprofile"),
    ("threading.settrace(tracer)", "threading.settrace"),
    ("ctypes.pythonapi.PyFrame_LocalsToFast(f, 0)", "ctypes.pythonapi.PyFrame_LocalsToFast"),
    ("from sys import _getframe as peek\npeek()", "sys._getframe"),
])
def test_each_introspection_form_is_reported_with_its_line_and_target(code, target):
    hit = one(code)
    assert (hit.line, hit.target, hit.kind) == (FIRST + code.count("\n"), target, INTROSPECTION), hit


# ------------------------------------------------------------------------------------ not reported
@pytest.mark.parametrize("code", [
    "np.random.seed(0)",
    'jax.config.update("jax_enable_x64", True)',
    'jax.config.update("jax_disable_jit", True)',
    "g = jax.grad(loss)(params)\nh = jnp.sum\nk = np.random",
    "print(jax.__version__, np.pi, builtins.len)",
    "np = 3\nnp.x = 1",
    "jnp = object()\njnp.sum = f",
    "import matplotlib.pyplot as plt\nplt.rcParams['figure.dpi'] = 100",
    "self.grad = g\nstate.params = p\ncfg.beta = 0.1\nd['jax'] = 1",
    "x = jnp.zeros(3)\nx.y = 1",
    "def f(jax):\n    jax.grad = 1",
    "for np in range(3):\n    np.x = 1",
    "setattr(state, 'params', p)\nobject.__setattr__(self, 'x', 1)",
    "cfg.__dict__.update(beta=0.1)\nstate.__dict__['x'] = 1",
    "float = lambda value=0.0: 0.0",
    "def grad(f):\n    return f\nfrom jax import grad as g2",
    "key = jax.random.PRNGKey(0)\nkey, sub = jax.random.split(key)",
])
def test_allowed_forms_are_not_reported(code):
    assert scan(IMPORTS + code) == []


def test_a_module_name_means_nothing_before_it_is_imported():
    assert scan("jax.grad = f\nsys.modules['jax'] = m") == []
    assert scan("import numpy as np\nnp = 3\nimport numpy as np\nnp.sum = f")[0].line == 4


# ----------------------------------------------------------------------- cells, magics, bad syntax
def test_aliases_carry_across_cells():
    cells = ["import jax.numpy as jnp\nfrom rlhf_lab import ppo", "x = 1", "jnp.sum = f", "ppo.clipped_surrogate = g",
             "jnp = 3", "jnp.sum = f", "import sys", "sys.modules.update(x=1)"]
    got = [(i, h.line, h.target) for i, h in scan_cells(cells)]
    assert got == [(2, 1, "jax.numpy.sum"), (3, 1, "rlhf_lab.ppo.clipped_surrogate"), (7, 1, "sys.modules.update")]


def test_a_cell_with_magics_is_read_with_its_own_line_numbers():
    cell = "%matplotlib inline\n!ls -la\nimport jax\n%time jax.grad = f\nfiles = !ls\njax.vmap = g\n"
    assert [(h.line, h.target) for h in scan(cell)] == [(4, "jax.grad"), (6, "jax.vmap")]
    assert [(h.line, h.target) for h in scan("%%capture\nimport jax\n\njax.jit = f\n")] == [(4, "jax.jit")]


def test_a_cell_that_does_not_parse_yields_nothing_and_later_cells_are_read():
    assert scan("import jax\njax.grad = f\ndef broken(:\n") == []
    got = scan_cells(["import jax", "jax.grad = (", "jax.grad = f"])
    assert [(i, h.line) for i, h in got] == [(2, 1)]


def test_one_hit_per_statement_and_the_text_of_the_statement():
    hits = scan("import jax\njax.grad = jax.vjp = (\n    f\n)\nfor x in sys_mod:\n    jax.jit = x\n")
    assert [(h.line, h.target, h.text) for h in hits] == [
        (2, "jax.grad", "jax.grad = jax.vjp = ( f )"), (6, "jax.jit", "jax.jit = x")]


# ------------------------------------------------------------------------------ the real pre-flight
ASSIGNMENT = "a1_ppo_objective"
NB1 = "01_clipped_objective"
ANSWER = "surrogate_table"  # an answer cell in the middle: tests above it keep their points
PATCH = "import jax\njax.grad = lambda f, argnums=0: (lambda *a, **k: 0.0)"


def _gid(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _tests_at_or_below(nb, gid: str) -> list:
    """The autograded test cells (``grade`` and not ``solution``) at or below the cell ``gid``."""
    at = next(i for i, c in enumerate(nb.cells) if _gid(c) == gid)
    return [_gid(c) for i, c in enumerate(nb.cells) if i >= at and c.cell_type == "code"
            and c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")]


def test_preflight_withholds_the_tests_below_a_rebinding_and_passes_the_clean_submission(tmp_path):
    root = tmp_path / "course"
    root.mkdir()
    for name in ("nbgrader_config.py", "release"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, root / name)
    good = correct_submission(ASSIGNMENT)
    patched = dict(good)
    nb = copy.deepcopy(good[NB1])
    at = next(i for i, c in enumerate(nb.cells) if _gid(c) == ANSWER)
    nb.cells[at].source = nb.cells[at].source.rstrip("\n") + "\n\n" + PATCH + "\n"
    patched[NB1] = nb
    write_submissions(root / "submitted", {"clean": {ASSIGNMENT: good}, "patched": {ASSIGNMENT: patched}})

    report = integrity.preflight(ASSIGNMENT, root, ["clean", "patched"], quarantine=False)

    codes = ("rebinding", "introspection")
    assert not [f for f in report.for_student("clean") if f.code in codes]
    assert not report.blocking("clean"), [f.text() for f in report.blocking("clean")]
    found = [f for f in report.for_student("patched") if f.code in codes]
    assert len(found) == 1, [f.text() for f in found]
    f = found[0]
    expected = _tests_at_or_below(nb, ANSWER)
    every_test = [_gid(c) for c in nb.cells if c.cell_type == "code" and _gid(c)
                  and c.metadata["nbgrader"].get("grade") and not c.metadata["nbgrader"].get("solution")]
    assert expected and set(expected) < set(every_test)  # the tests above the cell keep their points
    assert (f.code, f.severity, f.notebook, f.cell, f.grade_id) == ("rebinding", integrity.BLOCK, NB1 + ".ipynb",
                                                                    at, ANSWER)
    assert nb.cells[at].source.splitlines()[f.line - 1] == PATCH.splitlines()[-1]
    assert list(f.withhold) == [(NB1 + ".ipynb", gid) for gid in expected]
    assert "jax.grad = lambda f, argnums=0" in f.message and "jax.grad" in f.message
    assert "reviewed by the instructor" in f.message and "ask for a regrade" in f.message
    assert set(report.withheld("patched")[NB1 + ".ipynb"]) == set(expected)


def test_at_most_ten_findings_per_notebook_then_one_for_the_rest():
    spec = integrity.notebook_spec(REPO / "release" / ASSIGNMENT / f"{NB1}.ipynb")
    nb = correct_submission(ASSIGNMENT)[NB1]
    at = next(i for i, c in enumerate(nb.cells) if _gid(c) == ANSWER)
    nb.cells[at].source += "\n" + "\n".join(f"jax.f{k} = None" for k in range(13)) + "\n"
    checker = integrity._Checker(REPO, ASSIGNMENT, {spec.name: spec}, {}, quarantine=False)
    found = [f for f in checker.check_notebook("s", spec.name, nb) if f.code == "rebinding"]
    assert len(found) == integrity.MAX_REBINDING_FINDINGS + 1
    assert "3 more statement(s)" in found[-1].message and all(f.blocking for f in found)
    assert len({f.line for f in found}) == len(found)


def test_no_code_cell_of_the_course_source_is_reported():
    notebooks = sorted((REPO / "source").glob("*/*.ipynb"))
    assert len(notebooks) >= 10
    for path in notebooks:
        nb = nbformat.read(str(path), as_version=4)
        sources = [c.source if c.cell_type == "code" else "" for c in nb.cells]
        assert scan_cells(sources) == [], path
        for source in sources:  # and each cell alone
            assert scan(source) == [], (path, source[:80])


def test_the_course_model_answers_raise_no_finding_in_the_checker():
    for assignment in sorted(p.name for p in (REPO / "release").iterdir() if p.is_dir()):
        specs = integrity.release_specs(REPO, assignment)
        checker = integrity._Checker(REPO, assignment, specs, {}, quarantine=False)
        for stem, nb in correct_submission(assignment).items():
            found = checker.check_notebook("s", stem + ".ipynb", nb)
            assert not [f for f in found if f.code in ("rebinding", "introspection")], (assignment, stem)


def test_the_module_lists_what_the_brief_protects():
    assert rebinding.PROTECTED_ROOTS == {"jax", "jaxlib", "numpy", "optax", "builtins", "rlhf_lab", "IPython",
                                         "ipykernel"}
    assert rebinding.protected("sys.modules") and not rebinding.protected("sys.displayhook")
    assert not rebinding.protected("matplotlib.pyplot.rcParams")
