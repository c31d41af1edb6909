"""Per-notebook library builds and the copied-answer check (rlhf_lab/instructor/grader/library_build.py)."""
from __future__ import annotations

import ast
import inspect
import os
import textwrap
from pathlib import Path

import nbformat
import pytest

from course_support import REPO, correct_submission, replace_cell
from rlhf_lab.instructor.grader import library_build as lb


def test_the_manifest_is_what_the_source_notebooks_hidden_tests_forbid():
    assert lb.derive_manifest(REPO) == lb.MANIFEST


def test_forbid_lists_are_read_from_calls_constants_and_task_records():
    cell = textwrap.dedent('''
        FORBID = ("train", "make_train")
        grading.call(f, x, task="run_ppo", forbid=FORBID)
        grading.call(g, x, task="preference_loss", forbid=("*",))
        grading.call(h, x, task="other", forbid=("fit_reward", "_fit"))
        _TASK = {"task": "kl_divergence", "forbid": ("categorical_kl",)}
        grading.call(k, x, task="no_forbid")
    ''')
    names, star = lb.forbidden_names(cell)
    assert names == {"train", "make_train", "fit_reward", "_fit", "categorical_kl"}
    assert star == {"preference_loss"}
    assert lb.forbidden_names("def broken(:\n") == (set(), set())


def test_names_for_an_unknown_notebook_are_the_union_of_its_assignment():
    manifest = {"a/n1": ("f",), "a/n2": ("g", "h"), "b/n1": ("z",)}
    assert lb.names_for("a", "n2.ipynb", manifest) == ("g", "h")
    assert lb.names_for("a", None, manifest) == ("f", "g", "h")
    assert lb.names_for("a", "n9", manifest) == ()
    with pytest.raises(ValueError, match="assignment"):
        lb.notebook_key("a/b", "n1")


SOURCE = '''"""Module docstring."""
from .core import helper, removed_import, other


def keep_before(x):
    return x + 1


@decorate(
    "multi-line",
)
def drop_me(x):
    """The reference."""
    secret = x * 42
    return secret


def keep_after(x):
    return drop_me(x) + other(x)


__all__ = ["keep_before", "drop_me",
           "keep_after", "removed_import"]
'''


def test_strip_module_removes_definitions_and_reexports_and_keeps_every_other_line_in_place():
    out = lb.strip_module(SOURCE, {"drop_me"}, {"drop_me", "removed_import"})
    tree = ast.parse(out)
    assert "secret = x * 42" not in out and "def drop_me" not in out and '"multi-line"' not in out
    assert len(out.splitlines()) == len(SOURCE.splitlines())
    for name in ("keep_before", "keep_after"):
        line = next(i for i, text in enumerate(SOURCE.splitlines(), 1) if text.startswith(f"def {name}"))
        assert out.splitlines()[line - 1] == SOURCE.splitlines()[line - 1]
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert [a.name for a in imports[0].names] == ["helper", "other"]
    all_ = next(n for n in tree.body if isinstance(n, ast.Assign))
    assert ast.literal_eval(all_.value) == ["keep_before", "keep_after"]


def _toy_library(base: Path) -> Path:
    """A tiny package named like the course library: core.f is used by given code through g."""
    lib = base / "rlhf_lab"
    (lib / "instructor").mkdir(parents=True)
    (lib / "instructor" / "secret.py").write_text("TOKEN = 'instructor only'\n")
    (lib / "__init__.py").write_text("from .core import f, g, h\nfrom .extra import uses_h\n"
                                     "__all__ = ['f', 'g', 'h', 'uses_h']\n")
    (lib / "core.py").write_text(textwrap.dedent('''
        def f(x):
            return x * 1234567

        def g(x):
            return f(x) + 1

        def h(x):
            return x - 7654321

        LIMIT = 3
    '''))
    (lib / "extra.py").write_text("from .core import h\n\ndef uses_h(x):\n    return h(x)\n")
    (lib / "grading.py").write_text("")
    (lib / "lesson.py").write_text("")
    return lib


def test_plan_keeps_what_given_code_needs_and_removes_the_rest(tmp_path):
    lib = _toy_library(tmp_path)
    assert lb.plan_build(lib, ["f", "h"]).removed == (("core", "f"), ("core", "h"))
    plan = lb.plan_build(lib, ["f", "h"], given={("", "g")})  # given code calls g, which calls f
    assert plan.removed == (("core", "h"),) and plan.kept_for_given_code == ("f",)
    assert lb.plan_build(lib, ["nope"]).unknown == ("nope",)
    with pytest.raises(ValueError, match="names"):
        lb.plan_build(lib, "f")


def test_the_dependency_graph_is_computed_once_and_again_when_a_module_changes(tmp_path, monkeypatch):
    """Every graded notebook plans a build (the grader's process plans many): the walk of the
    library is done once per process while its files are unchanged, and again after an edit."""
    lib = _toy_library(tmp_path)
    walks = []
    real = lb._dependency_graph
    monkeypatch.setattr(lb, "_dependency_graph", lambda trees: walks.append(1) or real(trees))
    first = lb.plan_build(lib, ["f", "h"])
    assert lb.plan_build(lib, ["f", "h"]) == first and len(walks) == 1
    core = lib / "core.py"
    core.write_text(core.read_text().replace("return f(x) + 1", "return x + 1"))  # g no longer needs f
    os.utime(core, ns=(core.stat().st_atime_ns, core.stat().st_mtime_ns + 10**9))
    assert lb.plan_build(lib, ["f", "h"], given={("", "g")}).removed == (("core", "f"), ("core", "h"))
    assert len(walks) == 2


def test_the_given_names_of_a_source_notebook_are_read_once_and_again_when_it_changes(tmp_path, monkeypatch):
    """The kernels of a class run ask for the same notebook's build again and again: its source notebook's
    given code is read once per process while the file is unchanged, and again after an edit."""
    import json

    path = tmp_path / "01_nb.ipynb"
    path.write_text(json.dumps(_notebook([("from rlhf_lab import g\nresult = g(1)", False)])))
    reads = []
    real = lb.given_names
    monkeypatch.setattr(lb, "given_names", lambda nb: reads.append(nb) or real(nb))
    assert lb._given_names_cached(path) == {("", "g")}
    assert lb._given_names_cached(path) == {("", "g")} and len(reads) == 1
    lb._given_names_cached(path).add(("", "planted"))  # a caller's copy, never the cached set
    assert lb._given_names_cached(path) == {("", "g")} and len(reads) == 1
    path.write_text(json.dumps(_notebook([("from rlhf_lab import h\nresult = h(1)", False)])))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert lb._given_names_cached(path) == {("", "h")} and len(reads) == 2


def test_a_build_lacks_the_removed_functions_and_the_instructor_folder_and_is_reused(tmp_path):
    lib = _toy_library(tmp_path / "src")
    course = tmp_path / "course"
    course.mkdir()
    manifest = {"a1/nb": ("h",)}
    build = lb.ensure_build(course, "a1", "nb", library_dir=lib, manifest=manifest).path
    text = "".join(p.read_text() for p in build.rglob("*.py"))
    assert "7654321" not in text and "def h" not in text  # the removed function's text is gone
    assert "1234567" in text and not (build / "instructor").exists()
    assert build.is_relative_to(course / ".cache" / "library-builds")
    assert lb.verify_build(build.parent, [("core", "h")], [("", "f"), ("extra", "uses_h")]) == []
    again = lb.ensure_build(course, "a1", "nb", library_dir=lib, manifest=manifest)
    assert again.reused and again.path == build
    (lib / "core.py").write_text((lib / "core.py").read_text() + "\nLIMIT = 4\n")
    changed = lb.ensure_build(course, "a1", "nb", library_dir=lib, manifest=manifest)
    assert not changed.reused and changed.path != build
    full = lb.ensure_build(course, "a1", "nb", library_dir=lib, manifest=manifest, strip=False).path
    assert "7654321" in (full / "core.py").read_text()


def test_verification_names_what_is_wrong_with_a_build(tmp_path):
    lib = _toy_library(tmp_path)
    problems = lb.verify_build(tmp_path, [("core", "h")], [("", "missing_given")])
    assert "rlhf_lab.core.h is still defined" in problems
    assert "rlhf_lab.h is still exported" in problems
    assert any("missing_given" in p for p in problems)
    (lib / "extra.py").write_text("raise RuntimeError('broken module')\n")
    assert "broken module" in " ".join(lb.verify_build(tmp_path, [], []))


def _notebook(cells: list[tuple[str, bool]]) -> dict:
    return {"cells": [{"cell_type": "code", "source": src, "metadata": {"nbgrader": {
        "solution": solution, "grade_id": f"cell_{i}"}}} for i, (src, solution) in enumerate(cells)],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


RENAMED_COPY = '''
import jax.numpy as jnp

def my_clip_terms(r, adv,
                  eps):
    # written "by me"
    """Signed clipped surrogate."""
    c = jnp.clip(r, 1.0 - eps,
                 1.0 + eps)   # the band
    return jnp.minimum(r * adv, c * adv)
'''

HONEST = '''
import jax.numpy as jnp

def my_clip_terms(r, adv, eps):
    unclipped = r * adv
    clipped = jnp.clip(r, 1.0 - eps, 1.0 + eps) * adv
    return jnp.where(unclipped < clipped, unclipped, clipped)
'''


def _library_source(fn, name: str, docstring: bool = True) -> str:
    """``fn``'s source renamed to ``name`` and reformatted (ast round trip: comments dropped), with
    or without its docstring."""
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    node.name = name
    if not docstring:
        node.body = node.body[1:]
    return ast.unparse(node)


A1 = "a1_ppo_objective/01_clipped_objective"


def test_a_renamed_reformatted_copy_with_the_librarys_docstring_is_reported():
    """The library text (its docstring, a comment) is evidence no independent answer carries."""
    import rlhf_lab.ppo

    copied = _library_source(rlhf_lab.ppo.clipped_surrogate, "my_clip_terms")
    findings = lb.suspicious_copies(_notebook([(copied, True)]), key=A1)
    assert [(f.cell, f.function, f.library_function) for f in findings] == [
        ("cell_0", "my_clip_terms", "rlhf_lab.ppo.clipped_surrogate")]
    assert "copy of rlhf_lab.ppo.clipped_surrogate" in str(findings[0]) and "docstring" in str(findings[0])
    # a comment of the library's pasted into an honest-looking short copy is evidence too
    commented = RENAMED_COPY.replace("# written \"by me\"", "# the minimum is taken after multiplying by the "
                                     "advantage so the sign of A decides which bound can bind")
    assert [f.library_function for f in lb.suspicious_copies(_notebook([(commented, True)]), key=A1)] == [
        "rlhf_lab.ppo.clipped_surrogate"]


def test_a_long_library_function_the_student_must_write_is_reported_without_its_docstring():
    """A body of many statements is evidence by itself (identical code is not a coincidence);
    the functions nested in a reported copy are not reported again."""
    from rlhf_lab import sweep, trainer

    key = "a2_ppo_rlhf/03_rollouts"
    for fn in (sweep.sweep_grid, trainer._rollout_update):
        stripped = _library_source(fn, "mine", docstring=False)
        assert lb.body_size(ast.parse(stripped).body[0])[0] >= lb.COPY_MIN_STATEMENTS
        findings = lb.suspicious_copies(_notebook([(stripped, True)]), key=key)
        assert [(f.function, f.library_function) for f in findings] == [("mine", f"{fn.__module__}.{fn.__name__}")]
        assert "statements" in findings[0].evidence
        # the same body as a model answer of the notebook (the functions of its solution cells) is no evidence
        model = {lb.normalised(n) for n in _functions(stripped)}
        assert lb.suspicious_copies(_notebook([(stripped, True)]), key=key, model=model) == []


def test_a_short_copy_without_the_librarys_text_is_not_reported(tmp_path):
    """A two-line function has few ways to be written: the same normalised code as the library's is
    what correct answers write (the demo's preference_loss answers), never reported alone."""
    assert lb.suspicious_copies(_notebook([(RENAMED_COPY, True)]), key=A1) == []
    natural = {
        "a2_ppo_rlhf/01_losses": "def preference_loss(w, chosen, rejected):\n"
                                 "    margin = (chosen - rejected) @ w\n"
                                 "    return jnp.mean(jax.nn.softplus(-margin))\n",
        "a3_ppo_sequences/01_masks_and_sft": "def preference_loss(c, r):\n"
                                             "    return jnp.mean(jax.nn.softplus(-(c - r)))\n",
    }
    refs = lb.ReferenceIndex()
    for key, answer in natural.items():
        fn = ast.parse(answer).body[0]
        assert refs.match(fn) is not None  # the same normalised code as the library's ...
        assert lb.suspicious_copies(_notebook([(answer, True)]), refs=refs, key=key) == []  # ... not reported
    assert lb.suspicious_copies(_notebook([(HONEST, True)])) == []
    assert lb.suspicious_copies(_notebook([("def broken(:", True)])) == []
    with pytest.raises(ValueError, match="notebook"):
        lb.suspicious_copies(tmp_path / "missing.ipynb")


def test_only_library_code_the_notebook_asks_for_and_does_not_give_is_in_scope():
    import rlhf_lab.ppo

    copied = _library_source(rlhf_lab.ppo.clipped_surrogate, "my_clip_terms")
    nb = _notebook([(copied, True)])
    assert lb.suspicious_copies(nb, key=A1)
    assert lb.suspicious_copies(_notebook([(copied, False)]), key=A1) == []  # not an answer cell
    # a notebook that does not ask for it (a2's losses use the library's clipped_surrogate)
    assert ("ppo", "clipped_surrogate") not in lb.copy_scope("a2_ppo_rlhf/01_losses")
    assert lb.suspicious_copies(nb, key="a2_ppo_rlhf/01_losses") == []
    # asked for, but the notebook's given code uses it: given, so copying it copies nothing
    assert lb.suspicious_copies(nb, key=A1, given={("ppo", "clipped_surrogate")}) == []
    assert lb.copy_scope("a3_ppo_sequences/03_loop_and_analysis",
                         lb.given_names(REPO / "source" / "a3_ppo_sequences" / "03_loop_and_analysis.ipynb")) \
        .isdisjoint({("sequences.contrasts", "dpo_loss"), ("sequences.estimators", "k3")})
    # text the notebook gives (its statement quoting the library's docstring) is no evidence
    doc = rlhf_lab.ppo.clipped_surrogate.__doc__
    assert lb.suspicious_copies(nb, key=A1, given_text=doc) == []


def _solution_notebooks():
    """Every model answer (source/) and every example submission of a correct or classic-mistake
    student (examples/submissions/, the hostile class's control): ``(path, assignment, name)``."""
    paths = [*REPO.glob("source/*/*.ipynb"), *REPO.glob("examples/submissions/*/*/*.ipynb"),
             *REPO.glob("examples/hostile/h00_control_correct/*/*.ipynb")]
    return [(p, p.parent.name, p.name) for p in sorted(paths)]


def test_no_model_answer_or_example_or_alternative_correct_answer_is_reported():
    """The pre-flight's review (release, source and model answers known) reports none of them, and
    neither does the check with nothing known: every function some notebook asks for in scope,
    nothing given, no model answer (so nothing here passes only because it is the model answer)."""
    from rlhf_lab.instructor.grader import integrity
    from rlhf_lab.instructor.grader.preflight import review

    refs = lb.ReferenceIndex()
    specs: dict = {}
    checked = 0
    for path, assignment, name in _solution_notebooks():
        nb = nbformat.read(str(path), as_version=4)
        if assignment not in specs:
            try:
                specs[assignment] = integrity.release_specs(REPO, assignment)
            except FileNotFoundError:
                specs[assignment] = {}
        spec = specs[assignment].get(name)
        if spec is not None:
            assert review.library_copies(nb, assignment, name, spec, REPO) == [], path
        assert lb.suspicious_copies(nb, refs=refs, key=None, given=(), given_text="") == [], path
        checked += 1
    assert checked > 60
    alternative = (REPO / "tests" / "fixtures" / "alternative_answers.py").read_text(encoding="utf-8")
    assert lb.suspicious_copies(_notebook([(alternative, True)]), refs=refs, key=None, given=(),
                                given_text="") == []


VARIANTS = '''
def docstring_only(x):
    """Only a docstring."""

def two_strings(x):
    """A docstring."""
    "and a comment in disguise"

def annotated(x: int, *rest, key=None, **more) -> int:
    y: int
    z: float = x * 2.0
    return z + 1
'''


def _functions(source: str) -> list:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_lazy_reference_index_matches_what_the_full_fingerprints_match():
    """``ReferenceIndex.match`` (library functions normalised only when an answer has their shape)
    gives, for every function of the library itself, of every source, release and example
    notebook and of the cases above, what the dump of the whole library gives."""
    index, refs = lb.ReferenceIndex(), lb.reference_fingerprints()
    library = [n for tree in lb._modules(lb._installed_library()).values() for n in ast.walk(tree)
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    answers = []
    for path in sorted([*REPO.glob("source/*/*.ipynb"), *REPO.glob("release/*/*.ipynb"),
                        *REPO.glob("examples/submissions/*/*/*.ipynb")]):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                try:
                    answers += _functions(lb._strip_magics(cell.source))
                except SyntaxError:
                    pass
    cases = library + answers + _functions(RENAMED_COPY + HONEST + VARIANTS)
    assert len(library) > 100 and len(answers) > 100
    matched = 0
    for fn in cases:
        expected = refs.get(lb.normalised(fn))
        assert index.match(fn) == expected, ast.unparse(fn)[:300]
        matched += expected is not None
    assert matched > len(library) // 2  # the library's own functions match themselves


def _toy_library_with_subpackage(base: Path) -> Path:
    """The toy library plus ``seq/``: a subpackage re-exporting ``gae`` (needs ``core.h`` through
    ``from ..core``) and ``train`` (uses ``gae``), and ``seq/tools.py`` with ``helper``."""
    lib = _toy_library(base)
    (lib / "seq").mkdir()
    (lib / "seq" / "__init__.py").write_text("from .algo import gae, train\nfrom . import tools\n"
                                             "__all__ = ['gae', 'train', 'tools']\n")
    (lib / "seq" / "algo.py").write_text(textwrap.dedent('''
        from ..core import h
        from .tools import helper

        def gae(x):
            return h(x) * 31337

        def train(x):
            return gae(helper(x))

        def policy(x):
            return x * 2718
    '''))
    (lib / "seq" / "tools.py").write_text("def helper(x):\n    return x + 1\n")
    return lib


def test_functions_of_a_subpackage_are_removed_with_their_reexports(tmp_path):
    lib = _toy_library_with_subpackage(tmp_path / "src")
    assert {("seq.algo", "gae"), ("seq.algo", "train"), ("seq.tools", "helper")} <= lb.library_functions(lib)
    given = {("seq.algo", "policy")}  # given code needs only seq.algo.policy: gae can go
    plan = lb.plan_build(lib, ["gae", "policy"], given)
    assert plan.removed == (("seq.algo", "gae"),) and plan.kept_for_given_code == ("policy",)
    assert "seq" in plan.modules and "seq.algo" in plan.modules
    course = tmp_path / "course"
    course.mkdir()
    build = lb.ensure_build(course, "a1", "nb", library_dir=lib, manifest={"a1/nb": ("gae",)}).path
    algo = (build / "seq" / "algo.py").read_text()
    assert "31337" not in algo and "def gae" not in algo and "2718" in algo
    assert "gae" not in (build / "seq" / "__init__.py").read_text()  # the re-export is gone too
    assert lb.verify_build(build.parent, [("seq.algo", "gae")], [("seq", "train")]) == []


def test_a_subpackage_reexport_left_behind_is_named(tmp_path):
    lib = _toy_library_with_subpackage(tmp_path / "src")
    (lib / "seq" / "algo.py").write_text((lib / "seq" / "algo.py").read_text().replace("def gae(", "def _gae("))
    (lib / "seq" / "__init__.py").write_text("from .algo import _gae as gae, train\n")
    problems = lb.verify_build(tmp_path / "src", [("seq.algo", "_gae")], [])
    assert "rlhf_lab.seq.algo._gae is still defined" in problems


def test_given_code_that_needs_a_subpackage_function_keeps_it_in_the_build(tmp_path):
    lib = _toy_library_with_subpackage(tmp_path / "src")
    nb = _notebook([("import rlhf_lab.seq as sq\nresult = sq.train(3)", False),
                    ("def gae(x):\n    return x", True)])
    given = lb.given_names(nb)
    assert ("seq", "train") in given  # the alias is followed
    plan = lb.plan_build(lib, ["gae"], {p for p in given if p[0] in lb._module_files(lib)})
    assert plan.removed == () and plan.kept_for_given_code == ("gae",)  # train needs gae


def test_a_subpackage_no_given_code_imports_is_left_out_of_the_build(tmp_path):
    lib = _toy_library_with_subpackage(tmp_path / "src")
    course = tmp_path / "course"
    course.mkdir()
    build = lb.ensure_build(course, "a1", "nb", library_dir=lib, manifest={"a1/nb": ("gae",)}).path
    assert (build / "seq").is_dir()  # no source notebook: the build keeps every module
    plan = lb.plan_build(lib, ["gae"], given={("", "f")})
    assert not any(m == "seq" or m.startswith("seq.") for m in plan.modules)
    dest = tmp_path / "only_core"
    lb.write_build(lib, dest, plan.removed, plan.modules)
    assert not (dest / "rlhf_lab" / "seq").exists() and (dest / "rlhf_lab" / "core.py").is_file()


def test_the_sequence_notebooks_builds_lack_what_their_students_write():
    lib = lb._installed_library()
    for nb, absent in (("01_masks_and_sft", {"masked_nll", "sequence_logprob"}),
                       ("03_loop_and_analysis", {"expected_estimates"})):
        given = lb.given_names(REPO / "source" / "a3_ppo_sequences" / f"{nb}.ipynb")
        given = {p for p in given if p[0] in lb._module_files(lib)}
        plan = lb.plan_build(lib, lb.names_for("a3_ppo_sequences", nb), given)
        assert absent <= {name for _, name in plan.removed}, (nb, plan.removed)
    given = lb.given_names(REPO / "source" / "a3_ppo_sequences" / "02_ppo_pieces.ipynb")
    plan = lb.plan_build(lib, lb.names_for("a3_ppo_sequences", "02_ppo_pieces"),
                         {p for p in given if p[0] in lb._module_files(lib)})
    assert "sequences" not in plan.modules  # nothing given imports it: gae & co. are not there at all


def test_a_full_build_keeps_every_module_its_checks_import(tmp_path):
    """The compile-cache seed runs the source notebooks with the checks in the kernel (a full build):
    02_ppo_pieces' given code needs no sequences module, but its checks import rlhf_lab.sequences."""
    course = tmp_path / "course"
    (course / "source" / "a3_ppo_sequences").mkdir(parents=True)
    nb = REPO / "source" / "a3_ppo_sequences" / "02_ppo_pieces.ipynb"
    (course / "source" / "a3_ppo_sequences" / nb.name).write_bytes(nb.read_bytes())
    stripped = lb.ensure_build(course, "a3_ppo_sequences", "02_ppo_pieces").path
    full = lb.ensure_build(course, "a3_ppo_sequences", "02_ppo_pieces", strip=False).path
    assert not (stripped / "sequences").exists() and not (stripped / "judging").exists()
    assert (full / "judging" / "sequences_checks.py").is_file()
    assert "def gae(" in "".join(p.read_text() for p in (full / "sequences").glob("*.py"))


DELEGATED_GAE = '''def gae(rewards, values, mask, gamma, lam):
    """Hands the work to the course library (what the build must make impossible)."""
    import rlhf_lab.sequences as library
    return library.gae(rewards, values, mask, gamma, lam)
'''


@pytest.mark.slow
def test_an_answer_that_hands_gae_to_the_library_loses_exactly_the_gae_points(tmp_path, tmp_path_factory):
    """Real sandboxed nbgrader autograde of a3_ppo_sequences/02: the kernel's library build has no
    rlhf_lab.sequences (the notebook's given code never imports it), so the borrowed gae fails the
    two GAE checks and nothing else; the same notebook with its own gae keeps every point."""
    from course_support import fresh_course, own_db, session_base
    from rlhf_lab.instructor.classrun import pipeline

    root = fresh_course(tmp_path / "course", session_base(tmp_path_factory))
    nb_name = "02_ppo_pieces"
    correct = correct_submission("a3_ppo_sequences")[nb_name]
    for student, nb in (("ok_own_gae", correct), ("zz_borrowed_gae", replace_cell(correct, "gae_answer", DELEGATED_GAE))):
        folder = root / "submitted" / student / "a3_ppo_sequences"
        folder.mkdir(parents=True)
        nbformat.write(nb, str(folder / f"{nb_name}.ipynb"))
        run = pipeline.autograde_student("a3_ppo_sequences", student, root, db_url=own_db(root))
        assert run.ok, (student, run.reason, run.log_tail[-2000:])
    grades = pipeline.read_grades(root, own_db(root))
    own = {g: c for g, c in grades.by_cell("ok_own_gae", "a3_ppo_sequences").items() if c.notebook == nb_name}
    borrowed = {g: c for g, c in grades.by_cell("zz_borrowed_gae", "a3_ppo_sequences").items() if c.notebook == nb_name}
    tests = [g for g, c in own.items() if c.kind == "test"]
    assert tests and all(own[g].score == own[g].max_score for g in tests), {g: own[g].score for g in tests}
    lost = {g for g in tests if borrowed[g].score != borrowed[g].max_score}
    assert lost == {"test_seq_gae", "test_seq_gae_edges"}, {g: borrowed[g].score for g in tests}
    assert all(borrowed[g].score == 0 for g in lost)
    # the judge's verdict on the GAE checks: the kernel's library has no rlhf_lab.sequences at all
    graded = nbformat.read(str(root / "autograded" / "zz_borrowed_gae" / "a3_ppo_sequences" / f"{nb_name}.ipynb"), as_version=4)
    cell = next(c for c in graded.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_seq_gae")
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert errors and "No module named 'rlhf_lab.sequences'" in errors[0]["evalue"], errors


def test_the_delegation_recipes_target_functions_the_grading_build_removes():
    """The mistake recipes that delegate (run in full-library kernels by the source tests, where delegating
    works) are graded in a kernel whose build lacks the function they hand the task to."""
    import importlib.util

    def recipes(assignment):
        spec = importlib.util.spec_from_file_location(f"recipes_{assignment}", REPO / "examples" / "mistakes" /
                                                      f"{assignment}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return getattr(module, "ALL_MISTAKES", None) or module.MISTAKES

    targets = {"a1_ppo_objective": ("01_clipped_objective", "clipped_surrogate"),
               "a2_ppo_rlhf": ("01_losses", "ppo_loss")}
    for assignment, (notebook, function) in targets.items():
        delegating = [k for k, r in recipes(assignment).items() if r.get("delegation")]
        assert delegating, assignment
        assert function in lb.names_for(assignment, notebook, lb.MANIFEST), (assignment, notebook, function)
