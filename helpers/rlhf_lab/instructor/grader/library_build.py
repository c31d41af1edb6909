"""Per-notebook builds of the course library for grading kernels, and a check for copied answers.

A grading kernel runs in a sandbox (:mod:`.sandbox`) whose only copy of ``rlhf_lab`` is the
**build** for the notebook it grades: the library without ``instructor/`` and without the functions
that notebook asks students to implement. The definitions are physically absent from the files
(not hidden at run time), so an answer cannot delegate to them whatever names it computes.

* :data:`MANIFEST` is the one place that says which library functions each notebook's students
  implement (``"<assignment>/<notebook>"`` -> names). Its entries come from the ``forbid=`` /
  ``FORBID`` lists of the hidden tests in ``source/*/*.ipynb``; :func:`derive_manifest` reads
  them again so a test can prove the two agree.
* :func:`plan_build` decides what a build removes: the manifest's names, minus every function the
  notebook's given code needs (directly or through other library functions), so a function a
  later notebook uses as given code stays present in that notebook's build.
* :func:`ensure_build` writes the build under ``<course>/.cache/library-builds/<hash>/rlhf_lab``
  (cached by the content hash of the library and the removed names), removing each definition and
  its re-exports by an AST-guided edit that keeps every other line where it was (so tracebacks
  and JAX's compilation cache keys of the remaining code do not move), and verifies in a fresh
  interpreter that the build imports and lacks what it must lack.
* :func:`suspicious_copies` reports an answer cell whose function copies library code the notebook's
  students are asked to write and are not given: the same code up to names, comments, docstrings
  and formatting (normalised ASTs compared) *and* evidence beyond what a correct answer of that form
  shares (the library's docstring or comments, or a long body that is no model answer's), for an
  instructor to review; it runs in the grader, never in the kernel.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

#: Bump when the build procedure changes (old cached builds are then ignored).
BUILD_FORMAT = 1
#: Builds live here, under the course root.
BUILD_DIR = Path(".cache") / "library-builds"
#: Library files that never go into a build (instructor tooling and command-line entry points).
EXCLUDED = ("instructor", "demo.py", "lesson_cli.py", "__pycache__")
#: Grader-side packages: the hidden tests' checks and their reference computations. A stripped
#: build leaves them out too (the judge runs them in the grader); a full build, for notebooks
#: whose hidden tests still run in the kernel, keeps them.
GRADER_ONLY = ("judging",)

#: notebook ("<assignment>/<notebook stem>") -> library functions its students implement.
#: Derived from the hidden tests' ``forbid=`` / ``FORBID`` lists (``"*"`` stands for the task's own
#: name when that is a library function); ``tests/test_library_build.py`` re-derives it from the
#: source notebooks and fails when they disagree.
MANIFEST: dict[str, tuple[str, ...]] = {
    "a1_ppo_objective/01_clipped_objective": ("clipped_surrogate",),
    "a1_ppo_objective/02_kl_penalty_and_review": ("categorical_kl", "regularised_objective"),
    "a2_ppo_rlhf/01_losses": ("ppo_loss", "preference_loss"),
    "a2_ppo_rlhf/02_reward_and_reference": ("_fit", "_lesson_rewards_np", "fit_reward", "lesson_rewards"),
    "a2_ppo_rlhf/03_rollouts": ("_rollout_update", "exact_advantages", "make_train", "run_lesson",
                             "seed_style_train", "sweep_grid", "sweep_seeds", "train", "train_core"),
    "a2_ppo_rlhf/04_make_it_yours": ("enumerated_baseline_gradient", "exact_reward_gradient", "optimal_logp",
                                  "ppo_loss", "regularised_objective", "reward_kl_frontier"),
    "a3_ppo_sequences/01_masks_and_sft": ("masked_nll", "preference_loss", "response_mask", "sequence_logprob"),
    "a3_ppo_sequences/02_ppo_pieces": ("gae", "per_token_rewards", "policy_loss", "value_loss", "whiten"),
    "a3_ppo_sequences/03_loop_and_analysis": ("dpo_loss", "expected_estimates", "group_advantages", "k1", "k2", "k3",
                                           "length_normalised_score", "rloo_advantages"),
}


def _require_dir(value, name: str) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError(f"{name} must be a folder path (str or os.PathLike), got {value!r}")
    path = Path(value)
    if not path.is_dir():
        raise ValueError(f"{name} must be an existing folder, got {str(path)!r}")
    return path


def _require_names(names, name: str) -> tuple[str, ...]:
    if isinstance(names, str) or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ValueError(f"{name} must be a collection of Python identifiers, got {names!r}")
    return tuple(sorted(set(names)))


def notebook_key(assignment: str, notebook: str) -> str:
    """The manifest key of ``notebook`` (a file name or stem) in ``assignment``."""
    if not assignment or "/" in assignment or not notebook:
        raise ValueError(f"assignment and notebook must be non-empty names without '/', "
                         f"got {assignment!r}, {notebook!r}")
    return f"{assignment}/{Path(notebook).stem}"


def names_for(assignment: str, notebook: str | None, manifest: dict | None = None) -> tuple[str, ...]:
    """Library functions removed for ``notebook`` of ``assignment`` (manifest lookup).

    ``notebook=None`` (the kernel was not told which notebook it runs) gives the union over the
    assignment's notebooks: stricter, never looser.
    """
    manifest = MANIFEST if manifest is None else manifest
    if notebook:
        return tuple(sorted(manifest.get(notebook_key(assignment, notebook), ())))
    return tuple(sorted({n for key, names in manifest.items() if key.split("/")[0] == assignment
                         for n in names}))


# --- reading the source notebooks ------------------------------------------------------------------

def _cells(notebook) -> list[dict]:
    if isinstance(notebook, (str, os.PathLike)):
        try:
            notebook = json.loads(Path(notebook).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"notebook must be a readable .ipynb file, got {str(notebook)!r}: {exc}") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ValueError("notebook must be a path to an .ipynb file or a notebook dict with 'cells'")
    return notebook["cells"]


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _nbgrader(cell: dict) -> dict:
    return (cell.get("metadata") or {}).get("nbgrader") or {}


def _literal_names(node) -> list[str] | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def forbidden_names(cell_source: str) -> tuple[set[str], set[str]]:
    """(names, tasks with ``"*"``) of the ``forbid=`` / ``FORBID`` lists in one cell's code."""
    try:
        tree = ast.parse(cell_source)
    except SyntaxError:
        return set(), set()
    consts: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            names = _literal_names(node.value)
            if names is not None:
                consts[node.targets[0].id] = names
    found: set[str] = set()
    star_tasks: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            kw = {k.arg: k.value for k in node.keywords if k.arg}
        elif isinstance(node, ast.Dict):  # a task record such as {"task": ..., "forbid": (...)}
            kw = {k.value: v for k, v in zip(node.keys, node.values)
                  if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        else:
            continue
        if "forbid" not in kw:
            continue
        value = kw["forbid"]
        names = consts.get(value.id) if isinstance(value, ast.Name) else _literal_names(value)
        for name in names or ():
            if name == "*":
                task = _literal_names(kw["task"]) if "task" in kw else None
                star_tasks.update(task or ())
            else:
                found.add(name)
    return found, star_tasks


def _constants(trees) -> dict[str, object]:
    """Module-level string / tuple constants of some modules (``A = "x"``, ``N1, N2 = "a", "b"``)."""
    out: dict[str, object] = {}
    for tree in trees:
        for node in tree.body:
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target = node.targets[0]
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError):
                continue
            if isinstance(target, ast.Name):
                out[target.id] = value
            elif isinstance(target, ast.Tuple) and isinstance(value, tuple) and len(value) == len(target.elts):
                out.update({t.id: v for t, v in zip(target.elts, value) if isinstance(t, ast.Name)})
    return out


def judged_forbids(library_dir=None) -> dict[str, tuple[set[str], set[str]]]:
    """Forbid lists of the checks registered in the library's ``judging`` package (hidden tests
    whose code moved out of the notebooks): ``"<assignment>/<notebook>"`` -> (names, tasks with ``"*"``).

    Read from the source text (decorator calls with ``forbid=``, ``assignment=`` and ``notebook=``),
    never imported.
    """
    folder = Path(library_dir or _installed_library()) / "judging"
    trees = [ast.parse(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.py"))] if folder.is_dir() else []
    shared = _constants(trees)  # for names a module imports from another one (ALL, LOOP_FORBID)
    out: dict[str, tuple[set[str], set[str]]] = {}
    for tree in trees:
        own = _constants([tree])

        def value(node):
            if isinstance(node, ast.Name):
                return own.get(node.id, shared.get(node.id))
            try:
                return ast.literal_eval(node)
            except (ValueError, SyntaxError, TypeError):
                return None

        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            kw = {k.arg: value(k.value) for k in node.keywords if k.arg}
            forbid, assignment, notebook = kw.get("forbid"), kw.get("assignment"), kw.get("notebook")
            if not (isinstance(forbid, tuple) and isinstance(assignment, str) and isinstance(notebook, str)):
                continue
            names, star = out.setdefault(notebook_key(assignment, notebook), (set(), set()))
            for name in forbid:
                if name == "*":
                    if isinstance(kw.get("task"), str):
                        star.add(kw["task"])
                elif isinstance(name, str):
                    names.add(name)
    return out


def derive_manifest(root, library_dir=None) -> dict[str, tuple[str, ...]]:
    """Re-derive :data:`MANIFEST` from the hidden tests: the ``forbid`` lists in the graded cells
    of ``<root>/source/*/*.ipynb`` and those of the library's registered checks (:func:`judged_forbids`).

    Names in a ``forbid`` list that are not library functions (private helpers of the notebooks)
    are kept only when the library defines them; ``"*"`` maps to the task's own name when the
    library defines a function of that name.
    """
    root = _require_dir(root, "root")
    library_dir = library_dir or _installed_library()
    functions = set(name for _, name in library_functions(library_dir))
    judged = judged_forbids(library_dir)
    out: dict[str, tuple[str, ...]] = {}
    for path in sorted((root / "source").glob("*/*.ipynb")):
        found_j, star_j = judged.get(notebook_key(path.parent.name, path.name), (set(), set()))
        names: set[str] = found_j | {t for t in star_j if t in functions}
        for cell in _cells(path):
            if cell.get("cell_type") != "code" or not _nbgrader(cell).get("grade"):
                continue
            found, star_tasks = forbidden_names(_source(cell))
            names |= found | {t for t in star_tasks if t in functions}
        names &= functions
        if names:
            out[notebook_key(path.parent.name, path.name)] = tuple(sorted(names))
    return out


def given_names(notebook) -> set[tuple[str, str]]:
    """Library names the notebook's given (non-answer) code uses: ``(module, name)`` pairs.

    ``module`` is ``""`` for names imported from the package itself (``from rlhf_lab import x``).
    """
    used: set[tuple[str, str]] = set()
    trees = []
    for cell in _cells(notebook):
        if cell.get("cell_type") != "code" or _nbgrader(cell).get("solution"):
            continue
        try:
            trees.append(ast.parse(_strip_magics(_source(cell))))
        except SyntaxError:
            continue
    # names bound to library modules anywhere in the given code: rlhf_lab itself, and aliases
    # (``import rlhf_lab.sequences as sq``, ``from rlhf_lab import sequences as sq``)
    modules: dict[str, str] = {"rlhf_lab": ""}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("rlhf_lab.") and a.asname:
                        modules[a.asname] = a.name[len("rlhf_lab."):]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and (node.module == "rlhf_lab" or node.module.startswith("rlhf_lab.")):
                module = node.module[len("rlhf_lab."):] if "." in node.module else ""
                for a in node.names:
                    used.add((module, a.name))
                    # ``from rlhf_lab import sequences as sq``: sq may be a module (kept as both)
                    modules.setdefault(a.asname or a.name, f"{module}.{a.name}" if module else a.name)
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                chain = _dotted(node)
                if chain is None or chain[0] not in modules:
                    continue
                parts = [p for p in modules[chain[0]].split(".") if p] + chain[1:]
                # every prefix may be a module and the next part a name in it: keep each reading
                for i in range(len(parts)):
                    used.add((".".join(parts[:i]), parts[i]))
    return used


#: :func:`given_names` of the source notebooks this process read, by file and its (mtime, size): the
#: kernel of every notebook asks for its build again when the notebook is graded again.
_GIVEN: dict[tuple, frozenset] = {}


def _given_names_cached(notebook: Path) -> set[tuple[str, str]]:
    """:func:`given_names` of the file ``notebook``, read again only when the file changed."""
    key = _file_key(notebook)
    if key not in _GIVEN:
        _GIVEN[key] = frozenset(given_names(notebook))
    return set(_GIVEN[key])


def _dotted(node) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]`` (None when the chain does not start at a name)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _strip_magics(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


# --- the library's functions and what they need -----------------------------------------------------

def _installed_library() -> Path:
    """Folder of the installed ``rlhf_lab`` package (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("rlhf_lab")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the course library rlhf_lab is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0])


def _module_files(library_dir: Path) -> dict[str, Path]:
    """Modules of the library that go into builds: dotted name relative to the package ("" for its
    ``__init__``, ``"sequences"`` for a subpackage's ``__init__``, ``"sequences.ppo"``) -> file.

    :data:`EXCLUDED` and the grader-only packages (:data:`GRADER_ONLY`) are never part of it."""
    out = {}
    for path in sorted(Path(library_dir).rglob("*.py")):
        rel = path.relative_to(library_dir)
        if set(rel.parts) & {*EXCLUDED, *GRADER_ONLY}:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        elif len(parts) > 1 and not (path.parent / "__init__.py").is_file():
            continue  # a folder that is not a package
        out[".".join(parts)] = path
    return out


def _file_key(path: Path) -> tuple[str, int, int]:
    """What the per-process caches of this module key a file by: its real path, mtime and size."""
    st = path.stat()
    return str(path.resolve()), st.st_mtime_ns, st.st_size


#: Parsed library modules of this process, by file and its (mtime, size): one grading process plans
#: a build for every notebook, and each plan reads the whole library several times.
_PARSED: dict[tuple, ast.Module] = {}


def _modules(library_dir: Path) -> dict[str, ast.Module]:
    """The library's build modules (see :func:`_module_files`): dotted name -> AST.

    Each file is parsed once per process while it is unchanged; the trees are shared, so callers
    read them and never modify them (:func:`normalised` works on a copy)."""
    out = {}
    for name, path in _module_files(Path(library_dir)).items():
        key = _file_key(path)
        if key not in _PARSED:
            _PARSED[key] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        out[name] = _PARSED[key]
    return out


def _is_package(module: str, trees: dict) -> bool:
    return module == "" or any(m.startswith(module + ".") for m in trees)


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _relative_base(module: str, level: int, trees: dict) -> str | None:
    """The package a relative import of ``level`` dots in ``module`` starts from (None: outside)."""
    package = module if _is_package(module, trees) else module.rpartition(".")[0]
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    return ".".join(parts[:len(parts) - (level - 1)])


def library_functions(library_dir) -> set[tuple[str, str]]:
    """Every top-level function ``(module, name)`` defined by the library's build modules."""
    library_dir = _require_dir(library_dir, "library_dir")
    return {(mod, node.name) for mod, tree in _modules(library_dir).items() for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _imports(tree: ast.Module, module: str = "", trees: dict | None = None) -> dict[str, tuple[str, str | None]]:
    """Local name -> (module, name) for the relative imports of ``module`` (name None: the module
    itself). ``from .x import f`` -> ("<pkg>.x", "f"); ``from .. import checks`` -> ("checks", None)
    when ``checks`` is a module, else (parent package, "checks")."""
    trees = trees if trees is not None else {}
    out: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = _relative_base(module, node.level, trees) if trees else ("" if node.level == 1 else None)
            if base is None:
                continue
            for alias in node.names:
                local = alias.asname or alias.name
                if node.module:
                    out[local] = (_join(base, node.module), alias.name)
                elif not trees or _join(base, alias.name) in trees:
                    out[local] = (_join(base, alias.name), None)
                else:
                    out[local] = (base, alias.name)
    return out


def _refs(node, imports: dict, module: str, defined: set[str]) -> set[tuple[str, str]]:
    """Library ``(module, name)`` pairs a piece of code refers to (names and ``mod.attr``)."""
    found: set[tuple[str, str]] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            if sub.id in defined:
                found.add((module, sub.id))
            elif sub.id in imports and imports[sub.id][1] is not None:
                found.add(imports[sub.id])  # type: ignore[arg-type]
        elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                and sub.value.id in imports and imports[sub.value.id][1] is None:
            found.add((imports[sub.value.id][0], sub.attr))
    return found


def _resolve(pair: tuple[str, str], trees: dict[str, ast.Module], seen=None) -> tuple[str, str]:
    """Follow re-exports (``from .ppo import f`` in ``__init__``) to the defining module."""
    module, name = pair
    seen = seen or set()
    tree = trees.get(module)
    if tree is None or pair in seen:
        return pair
    seen.add(pair)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return pair
    target = _imports(tree, module, trees).get(name)
    if target is not None and target[1] is not None:
        return _resolve(target, trees, seen)  # type: ignore[arg-type]
    return pair


#: :func:`dependency_graph` of this process, by the library's files and their (mtime, size): the
#: kernel of every notebook plans a build, and the walk is most of a plan.
_GRAPHS: dict[tuple, tuple[dict, dict]] = {}


def dependency_graph(library_dir) -> tuple[dict, dict]:
    """(edges, roots): each top-level function or class -> library names it uses; roots: module ->
    names its module-level code uses (needed whenever the module is imported).

    Computed once per process while the library's files are unchanged; the result is shared, so
    callers read it and never modify it (as the trees of :func:`_modules`)."""
    library_dir = _require_dir(library_dir, "library_dir")
    trees = _modules(library_dir)
    key = tuple(sorted((name, id(tree)) for name, tree in trees.items()))
    if key not in _GRAPHS:
        _GRAPHS[key] = _dependency_graph(trees)
    return _GRAPHS[key]


def _dependency_graph(trees: dict[str, ast.Module]) -> tuple[dict, dict]:
    edges: dict[tuple[str, str], set[tuple[str, str]]] = {}
    roots: set[tuple[str, str]] = set()
    roots_by_module: dict[str, set[tuple[str, str]]] = {}
    for module, tree in trees.items():
        imports = _imports(tree, module, trees)
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        def refs(node):
            return {_resolve(p, trees) for p in _refs(node, imports, module, defined)}

        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                edges[(module, node.name)] = refs(node) - {(module, node.name)}
            elif isinstance(node, ast.ClassDef):
                # what runs when the class statement runs is needed at import; method bodies only
                # when something uses the class
                at_import = [*node.bases, *node.keywords, *node.decorator_list]
                methods = []
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        at_import += [*item.decorator_list, *item.args.defaults,
                                      *[d for d in item.args.kw_defaults if d is not None]]
                        methods.append(item)
                    else:
                        at_import.append(item)
                for part in at_import:
                    roots |= refs(part)
                edges[(module, node.name)] = set().union(*map(refs, methods)) - {(module, node.name)} \
                    if methods else set()
            else:
                roots |= refs(node)
        roots_by_module[module] = roots
        roots = set()
    return edges, roots_by_module


def _closure(start: set, edges: dict) -> set:
    seen, stack = set(), list(start)
    while stack:
        item = stack.pop()
        if item in seen:
            continue
        seen.add(item)
        stack.extend(edges.get(item, ()))
    return seen


#: Modules every build has besides what the package imports: the notebooks' first cell imports
#: ``grading`` (which imports ``ppo`` and ``reward``, found by :func:`module_imports`).
ALWAYS_MODULES = ("grading",)


def module_imports(library_dir) -> dict[str, set[str]]:
    """Module -> library modules it imports at module level (``from .x import y``, ``from . import x``,
    ``from .. import y``); importing a submodule imports its parent packages too."""
    library_dir = _require_dir(library_dir, "library_dir")
    trees = _modules(library_dir)
    out: dict[str, set[str]] = {}
    for module, tree in trees.items():
        deps = {mod for mod, _ in _imports(tree, module, trees).values()}
        parent = module.rpartition(".")[0] if module else None
        while parent is not None:  # ``import rlhf_lab.sequences.ppo`` runs the packages' __init__ first
            deps.add(parent)
            parent = parent.rpartition(".")[0] if parent else None
        out[module] = (deps & set(trees)) - {module}
    return out


def needed_modules(library_dir, given=()) -> tuple[str, ...]:
    """Modules a build contains: the package, :data:`ALWAYS_MODULES`, the modules given code
    imports, and everything those import. A module nothing needs is left out of the build."""
    graph = module_imports(library_dir)
    start = {"", *ALWAYS_MODULES, *(m for m, _ in given if m in graph),
             *(_join(m, n) for m, n in given if _join(m, n) in graph)}
    return tuple(sorted(_closure(start & set(graph), graph)))


@dataclass
class BuildPlan:
    """What a build removes, and what it keeps although the manifest names it (given code needs it)."""
    removed: tuple[tuple[str, str], ...]
    kept_for_given_code: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()   # manifest names the library does not define
    modules: tuple[str, ...] = ()   # modules in the build ("" is the package's __init__)


def plan_build(library_dir, names, given=(), all_modules: bool = False) -> BuildPlan:
    """Which definitions a build without ``names`` removes.

    Every definition of a name in ``names`` goes (whatever module defines it), except those the
    given code (``given``: ``(module, name)`` pairs, see :func:`given_names`) or module-level
    library code needs, directly or through other library functions. The build holds the modules
    the given code needs (:func:`needed_modules`), or every module with ``all_modules=True`` (for
    a notebook whose given code is unknown).
    """
    library_dir = _require_dir(library_dir, "library_dir")
    names = _require_names(names, "names")
    trees = _modules(library_dir)
    edges, roots = dependency_graph(library_dir)
    modules = tuple(sorted(trees)) if all_modules else needed_modules(library_dir, given)
    functions = set(edges)
    wanted = {pair for pair in functions if pair[1] in names and pair[0] in modules}
    roots = set().union(*(roots.get(m, set()) for m in modules))
    needed = _closure({_resolve(p, trees) for p in given} | roots, edges)
    kept = sorted({name for _, name in wanted & needed})
    return BuildPlan(removed=tuple(sorted(wanted - needed)), kept_for_given_code=tuple(kept),
                     unknown=tuple(sorted(set(names) - {n for _, n in functions})), modules=modules)


# --- writing a build ----------------------------------------------------------------------------------

def _span(node) -> tuple[int, int]:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return start, node.end_lineno


def strip_module(source: str, removed: set[str], dropped_imports: set[str]) -> str:
    """``source`` without the top-level functions ``removed`` and without ``dropped_imports`` in its
    relative imports and ``__all__``; every other line keeps its number (edits are padded)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in removed:
            edits.append((*_span(node), ""))
        elif isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module \
                and any((a.asname or a.name) in dropped_imports for a in node.names):
            keep = [a for a in node.names if (a.asname or a.name) not in dropped_imports]
            text = ast.unparse(ast.ImportFrom(module=node.module, names=keep, level=node.level)) if keep else ""
            edits.append((*_span(node), text))
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names = _literal_names(node.value)
            if names is not None and set(names) & dropped_imports:
                edits.append((*_span(node), "__all__ = " + repr([n for n in names if n not in dropped_imports])))
    for start, end, text in sorted(edits, reverse=True):
        count = end - start + 1
        body = (text + "\n") if text else ""
        body += "\n" * (count - (1 if text else 0))
        lines[start - 1:end] = [body]
    return "".join(lines)


def build_hash(library_dir, removed: tuple[tuple[str, str], ...], modules=()) -> str:
    """Content hash of a build: the library's build files, its modules and the removed definitions."""
    library_dir = _require_dir(library_dir, "library_dir")
    digest = hashlib.sha256(f"format={BUILD_FORMAT};python={sys.version_info[:2]}".encode())
    for path in sorted(library_dir.rglob("*")):
        rel = path.relative_to(library_dir)
        if path.is_file() and not (set(rel.parts) & set(EXCLUDED)) and path.suffix != ".pyc":
            digest.update(rel.as_posix().encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    digest.update(json.dumps([sorted(removed), sorted(modules)]).encode())
    return digest.hexdigest()[:24]


def write_build(library_dir, dest, removed: tuple[tuple[str, str], ...], modules=None,
                exclude: tuple[str, ...] = ()) -> Path:
    """Copy the library into ``dest/rlhf_lab`` without :data:`EXCLUDED` and ``exclude``, without
    the modules not in ``modules`` (None: all) and without the ``removed`` definitions."""
    library_dir = _require_dir(library_dir, "library_dir")
    target = Path(dest) / "rlhf_lab"
    files = _module_files(library_dir)
    all_trees = _modules(library_dir)
    trees = all_trees
    skipped: set[Path] = set()
    if modules is not None:
        # a module nothing needs stays out, and so does a subpackage none of whose modules is needed
        skipped = {files[m].resolve() for m in trees if m and m not in modules}
        for m in trees:
            if m and _is_package(m, trees) and not any(k == m or k.startswith(m + ".") for k in modules):
                skipped.add(files[m].parent.resolve())
        trees = {m: t for m, t in trees.items() if m in modules}
    patterns = shutil.ignore_patterns(*EXCLUDED, *exclude, "*.pyc")

    def ignore(folder, names):
        out = set(patterns(folder, names))
        return out | {n for n in names if (Path(folder) / n).resolve() in skipped}

    shutil.copytree(library_dir, target, ignore=ignore)
    by_module: dict[str, set[str]] = {}
    for module, name in removed:
        by_module.setdefault(module, set()).add(name)
    for module in trees:
        path = target / files[module].relative_to(library_dir)
        # names this module imports (or re-exports) from a module whose definition was removed
        dropped = {local for local, (mod, name) in _imports(trees[module], module, all_trees).items()
                   if name is not None and _resolve((mod, name), all_trees) in set(removed)}
        own = by_module.get(module, set())
        if own or dropped:
            path.write_text(strip_module(path.read_text(encoding="utf-8"), own, dropped | own), encoding="utf-8")
    for folder, dirs, files in os.walk(target):
        os.chmod(folder, 0o755)
        for f in files:
            os.chmod(os.path.join(folder, f), 0o644)
    return target


_VERIFY = r"""
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
spec = json.loads(sys.argv[2])
import rlhf_lab
assert rlhf_lab.__file__.startswith(sys.argv[1]), rlhf_lab.__file__
problems = []
for mod in spec["modules"]:
    try:
        m = importlib.import_module("rlhf_lab." + mod) if mod else rlhf_lab
    except Exception as exc:
        problems.append(f"import rlhf_lab.{mod}: {type(exc).__name__}: {exc}")
        continue
for mod, name in spec["removed"]:
    m = sys.modules.get("rlhf_lab." + mod if mod else "rlhf_lab")
    if m is not None and hasattr(m, name):
        problems.append(f"rlhf_lab.{mod}.{name} is still defined")
    if hasattr(rlhf_lab, name):
        problems.append(f"rlhf_lab.{name} is still exported")
    for other in spec["modules"]:  # re-exported by a subpackage (rlhf_lab.sequences.gae)
        o = sys.modules.get("rlhf_lab." + other) if other else None
        fn = getattr(o, name, None) if o is not None and other != mod else None
        if fn is not None and getattr(fn, "__module__", None) == "rlhf_lab." + mod:
            problems.append(f"rlhf_lab.{other}.{name} is still exported")
for mod, name in spec["given"]:
    m = sys.modules.get("rlhf_lab." + mod if mod else "rlhf_lab")
    if m is None or not hasattr(m, name):
        problems.append(f"given code needs rlhf_lab{'.' + mod if mod else ''}.{name}, missing from the build")
print(json.dumps(problems))
"""


def verify_build(build_root, removed, given=(), timeout: int = 180) -> list[str]:
    """Import the build in a fresh interpreter; return problems (empty: the build is good).

    Every build module must import, no removed name may remain (nor be exported by the package),
    and every name the given code uses must be present. Also leaves compiled bytecode in the build.
    """
    build_root = _require_dir(build_root, "build_root").resolve()
    modules = sorted(_modules(build_root / "rlhf_lab"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    spec = json.dumps({"modules": modules, "removed": [list(p) for p in removed],
                       "given": [list(p) for p in given]})
    proc = subprocess.run([sys.executable, "-I", "-c", _VERIFY, str(build_root), spec], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=str(build_root))
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return [f"the build does not import: {tail}"]
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [f"the build's check printed no verdict: {proc.stdout[-200:]!r}"]


@dataclass
class Build:
    """A verified build: ``path`` is its ``rlhf_lab`` folder."""
    path: Path
    plan: BuildPlan
    key: str
    reused: bool = False
    notes: list[str] = field(default_factory=list)


def ensure_build(course_root, assignment: str, notebook: str | None, library_dir=None,
                 manifest: dict | None = None, strip: bool = True) -> Build:
    """The verified build for ``notebook`` of ``assignment`` (made once, then reused by hash).

    ``strip=False`` gives the full library (still without ``instructor/``), for hidden tests that
    still need the reference functions inside the kernel. Raises ``RuntimeError`` naming the
    problem when a build does not verify (grading must not go on with a broken library).
    """
    course_root = _require_dir(course_root, "course_root").resolve()
    library_dir = _require_dir(library_dir or _installed_library(), "library_dir").resolve()
    names = names_for(assignment, notebook, manifest) if strip else ()
    source_nb = course_root / "source" / assignment / f"{Path(notebook).stem}.ipynb" if notebook else None
    known = source_nb is not None and source_nb.is_file()
    module_files = _module_files(library_dir)
    # readings that name a real module
    given = {p for p in _given_names_cached(source_nb) if p[0] in module_files} if known else set()
    # a full build keeps the checks (judging/), which import any module of the library: all of them
    plan = plan_build(library_dir, names, given, all_modules=not known or not strip)
    exclude = GRADER_ONLY if strip else ()
    key = build_hash(library_dir, plan.removed, (*plan.modules, *(f"-{e}" for e in exclude)))
    parent = course_root / BUILD_DIR
    final = parent / key
    notes = [f"kept {n}: the notebook's given code needs it" for n in plan.kept_for_given_code]
    if (final / "rlhf_lab" / "__init__.py").is_file() and (final / "VERIFIED").is_file():
        return Build(final / "rlhf_lab", plan, key, reused=True, notes=notes)
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=parent))
    try:
        write_build(library_dir, staging, plan.removed, plan.modules, exclude)
        problems = verify_build(staging, plan.removed, sorted(given))
        if problems:
            raise RuntimeError(f"library build for {assignment}/{notebook or '*'} is unusable: "
                               + "; ".join(problems))
        (staging / "VERIFIED").write_text(json.dumps({"removed": plan.removed, "kept": plan.kept_for_given_code},
                                                     indent=1) + "\n")
        os.chmod(staging, 0o755)
        try:
            staging.rename(final)
        except OSError:  # another grader finished the same build first: use theirs
            if not (final / "VERIFIED").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Build(final / "rlhf_lab", plan, key, notes=notes)


# --- copies of library functions in answer cells --------------------------------------------------
#
# Two functions with the same normalised AST (:func:`normalised`) are not evidence of copying when
# they are short: ``jnp.mean(jax.nn.softplus(-(c - r)))`` is both the library's ``preference_loss``
# and what most correct students write, since a two-line function has only a few ways to be written.
# A finding therefore needs three things (:func:`suspicious_copies`):
#
# 1. scope: the library function (or a function nested in it) is one the notebook's students are
#    asked to write and are not given (:func:`copy_scope`: the manifest's names minus what the
#    notebook's given code needs); a copy of anything else copies nothing the student was graded on;
# 2. structure: the answer function's normalised AST equals the library function's;
# 3. evidence beyond what any correct answer shares, one of
#    * text: the answer function's docstrings, bare strings or comments repeat
#      :data:`COPY_MIN_WORDS` consecutive words of the library function's docstrings or comments
#      that the notebook does not give (release text, and the model answer's when known), or
#    * size: the normalised body has at least :data:`COPY_MIN_STATEMENTS` statements and
#      :data:`COPY_MIN_NODES` AST nodes (long enough that an identical body is not a coincidence),
#      and it is not the form of a model answer of the notebook.

#: Size evidence: the normalised body of a copied function has at least this many statements ...
COPY_MIN_STATEMENTS = 6
#: ... and at least this many AST nodes (contexts and operators not counted).
COPY_MIN_NODES = 90
#: Text evidence: this many consecutive words of the library function's docstring or comments.
COPY_MIN_WORDS = 8


@dataclass(frozen=True)
class Finding:
    """An answer-cell function that is a library function up to names, comments and formatting,
    with evidence of copying beyond what every correct answer shares (``evidence``)."""
    cell: str          # the answer cell's nbgrader grade_id (or "cell <index>")
    function: str      # the name the student gave it
    library_function: str  # "rlhf_lab.<module>.<name>"
    line: int          # line of the ``def`` inside the cell
    evidence: str = ""  # why this is a copy and not an independent answer of the same form

    def __str__(self) -> str:
        return (f"{self.cell}: {self.function} (line {self.line}) is a copy of {self.library_function} "
                f"up to names and formatting ({self.evidence or 'the same normalised code'})")


class _Canonical(ast.NodeTransformer):
    """Rename a function's own name, arguments and local names to placeholders in order of first
    appearance; drop docstrings and annotations. Globals and attributes keep their names."""

    def __init__(self, local_names: set[str]):
        self.local_names = local_names
        self.mapping: dict[str, str] = {}

    def _name(self, name: str) -> str:
        if name not in self.local_names:
            return name
        return self.mapping.setdefault(name, f"_v{len(self.mapping)}")

    def visit_FunctionDef(self, node):
        node.name = self._name(node.name)
        node.returns = None
        node.type_comment = None
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:] or [ast.Pass()]
        node.body = body
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.generic_visit(node)
        return node

    def visit_arg(self, node):
        node.arg = self._name(node.arg)
        node.annotation = None
        node.type_comment = None
        return node

    def visit_Name(self, node):
        node.id = self._name(node.id)
        return node

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return None  # a bare string statement is a comment in disguise
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node):
        self.generic_visit(node)
        if node.value is None:
            return None
        return ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno)


def _local_names(fn: ast.AST) -> set[str]:
    """The function's own name, its arguments and every name it (or a nested function) binds."""
    names = {fn.name}
    for sub in ast.walk(fn):
        if isinstance(sub, ast.arg):
            names.add(sub.arg)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            names.add(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(sub.name)
    globals_ = {n for sub in ast.walk(fn) if isinstance(sub, (ast.Global, ast.Nonlocal)) for n in sub.names}
    return names - globals_


def _canonical(fn: ast.AST) -> ast.AST:
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ValueError(f"fn must be an ast.FunctionDef, got {type(fn).__name__}")
    copy = ast.parse(ast.unparse(fn)).body[0]
    copy = _Canonical(_local_names(copy)).visit(copy)
    copy.decorator_list = []
    return copy


def normalised(fn: ast.AST) -> str:
    """A canonical dump of a function definition (see :class:`_Canonical`)."""
    return ast.dump(_canonical(fn), annotate_fields=False, include_attributes=False)


_NOT_COUNTED = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


def body_size(fn: ast.AST) -> tuple[int, int]:
    """(statements, AST nodes) of a function's normalised body (its ``def`` itself, docstrings,
    annotations, expression contexts and operators not counted): what size evidence reads."""
    copy = _canonical(fn)
    statements = sum(isinstance(n, ast.stmt) for n in ast.walk(copy)) - 1
    nodes = sum(not isinstance(n, _NOT_COUNTED) for n in ast.walk(copy)) - 1
    return statements, nodes


def _long_enough(size: tuple[int, int]) -> bool:
    return size[0] >= COPY_MIN_STATEMENTS and size[1] >= COPY_MIN_NODES


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())


def _grams(text: str, n: int = COPY_MIN_WORDS) -> set[tuple[str, ...]]:
    """Runs of ``n`` consecutive words of ``text`` (lower case, punctuation dropped)."""
    words = _words(text)
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def _comments(source: str, first: int, last: int) -> list[str]:
    """The ``#`` comments on lines ``first``..``last`` (1-based) of ``source``."""
    import io
    import tokenize

    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and first <= tok.start[0] <= last:
                out.append(tok.string.lstrip("#"))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def function_text(fn: ast.AST, source: str) -> str:
    """The prose of a function: its (and its nested functions') docstrings and bare strings, and
    the comments on its lines of ``source`` (the text ``fn`` was parsed from)."""
    strings = [sub.value.value for sub in ast.walk(fn) if isinstance(sub, ast.Expr)
               and isinstance(sub.value, ast.Constant) and isinstance(sub.value.value, str)]
    return "\n".join(strings + _comments(source, fn.lineno, fn.end_lineno or fn.lineno))


def _library_entries(library_dir=None):
    """``(node, "rlhf_lab.<module>.<name>", (module, top-level name), module)`` for every
    non-trivial function of the library (nested ones and methods included, with the top-level
    function or class they belong to), in library order."""
    library_dir = _require_dir(library_dir or _installed_library(), "library_dir")
    for module, tree in _modules(library_dir).items():
        for top in tree.body:
            owner = (module, top.name) if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                else None
            for node in ast.walk(top):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _trivial(node):
                    yield node, f"rlhf_lab.{module + '.' if module else ''}{node.name}", owner, module


def _library_functions(library_dir=None):
    """``(node, "rlhf_lab.<module>.<name>")`` for every non-trivial function of the library (nested
    ones included; a trivial one is a single ``return`` of a name or constant), in library order."""
    for node, name, _, _ in _library_entries(library_dir):
        yield node, name


def reference_fingerprints(library_dir=None) -> dict[str, str]:
    """Normalised dump -> ``rlhf_lab.<module>.<name>`` for every function of the library (nested
    ones included); trivial functions (a single ``return`` of a name or constant) are skipped."""
    out: dict[str, str] = {}
    for node, name in _library_functions(library_dir):
        out.setdefault(normalised(node), name)
    return out


def _shape(fn: ast.AST) -> tuple:
    """A cheap necessary condition for two functions to have the same :func:`normalised` dump.

    Their kind, argument counts and the kinds of their top-level statements as :class:`_Canonical`
    leaves them (bare strings and value-less annotations dropped, an annotated assignment counted
    as an assignment, an empty body as ``pass``): equal dumps always give equal shapes."""
    a = fn.args
    kinds = []
    for stmt in fn.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            continue
        if isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                kinds.append("Assign")
            continue
        kinds.append(type(stmt).__name__)
    return (type(fn).__name__, len(a.posonlyargs), len(a.args), len(a.kwonlyargs), a.vararg is not None,
            a.kwarg is not None, tuple(kinds) or ("Pass",))


@dataclass
class _Entry:
    node: ast.AST
    name: str                      # "rlhf_lab.<module>.<name>"
    owner: tuple | None            # (module, top-level function or class) it belongs to
    module: str
    dump: str | None = None        # normalised, computed when an answer has its shape
    text: str | None = None        # its docstrings and comments, read when it matched


class ReferenceIndex:
    """:func:`reference_fingerprints`, normalising a library function only when an answer could match it.

    Normalising the whole library costs about a second of CPU per grading process; an answer
    function is compared only with the library functions of its :func:`_shape`, each normalised
    once. ``match(fn)`` gives what ``reference_fingerprints().get(normalised(fn))`` gives;
    :meth:`matches` gives every library function of ``fn``'s form, with what copy evidence needs."""

    def __init__(self, library_dir=None):
        self.library_dir = _require_dir(library_dir or _installed_library(), "library_dir")
        self._buckets: dict[tuple, list[_Entry]] = {}
        for node, name, owner, module in _library_entries(self.library_dir):
            self._buckets.setdefault(_shape(node), []).append(_Entry(node, name, owner, module))

    def matches(self, fn: ast.AST, within=None) -> list[_Entry]:
        """Library functions (in library order) whose normalised dump is ``fn``'s; with ``within``
        (``(module, name)`` pairs), only those that are or belong to one of these functions."""
        candidates = [e for e in self._buckets.get(_shape(fn), ()) if within is None or e.owner in within]
        if not candidates:
            return []
        dump = normalised(fn)
        out = []
        for entry in candidates:
            if entry.dump is None:
                entry.dump = normalised(entry.node)
            if entry.dump == dump:
                out.append(entry)
        return out

    def match(self, fn: ast.AST) -> str | None:
        """The first library function (in library order) whose normalised dump is ``fn``'s, or None."""
        found = self.matches(fn)
        return found[0].name if found else None

    def text(self, entry: _Entry) -> str:
        """The library function's docstrings and comments (:func:`function_text`)."""
        if entry.text is None:
            path = _module_files(self.library_dir)[entry.module]
            entry.text = function_text(entry.node, path.read_text(encoding="utf-8"))
        return entry.text


def _trivial(fn) -> bool:
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return len(body) <= 1 and all(isinstance(s, (ast.Pass, ast.Return)) and
                                  isinstance(getattr(s, "value", None), (ast.Name, ast.Constant, type(None)))
                                  for s in body)


def copy_scope(key: str | None, given=(), library_dir=None) -> frozenset:
    """Library functions ``(module, name)`` whose copy :func:`suspicious_copies` reports for the
    notebook ``key`` (``"<assignment>/<notebook>"``): those its students are asked to write
    (:data:`MANIFEST`) and are not given: neither used by the notebook's given code (``given``,
    :func:`given_names`) nor by a library function that code uses. A key the manifest does not know
    gives the names of its assignment's notebooks, or of every notebook."""
    library_dir = _require_dir(library_dir or _installed_library(), "library_dir")
    if key in MANIFEST:
        names = MANIFEST[key]
    else:
        names = names_for(key.split("/")[0], None) if key else ()
        names = names or tuple(sorted({n for v in MANIFEST.values() for n in v}))
    trees = _modules(library_dir)
    edges, _ = dependency_graph(library_dir)
    needed = _closure({_resolve(p, trees) for p in given if p[0] in trees}, edges)
    return frozenset(pair for pair in edges if pair[1] in names and pair not in needed)


def _key_of(notebook) -> str | None:
    if isinstance(notebook, (str, os.PathLike)):
        path = Path(notebook)
        if path.parent.name:
            return f"{path.parent.name}/{path.stem}"
    return None


def model_forms(source_notebook) -> set[str]:
    """Normalised dumps of every function in the solution cells of a source notebook (the model
    answers): an identical body is never size evidence of a copy (:func:`suspicious_copies`)."""
    out = set()
    for cell in _cells(source_notebook):
        if cell.get("cell_type") != "code" or not _nbgrader(cell).get("solution"):
            continue
        try:
            tree = ast.parse(_strip_magics(_source(cell)))
        except SyntaxError:
            continue
        out |= {normalised(n) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return out


def notebook_text(notebook) -> str:
    """Every cell's text of a notebook (a path or a notebook dict), one after the other."""
    return "\n".join(_source(c) for c in _cells(notebook))


def suspicious_copies(notebook, library_dir=None, refs: ReferenceIndex | None = None, *, key: str | None = None,
                      given=None, given_text: str | None = None, model=()) -> list[Finding]:
    """Answer-cell functions of ``notebook`` that copy library code its students must write.

    A function is reported when (see the comment above :data:`COPY_MIN_STATEMENTS`) it is, up to
    names, comments and formatting, a library function of :func:`copy_scope` and it carries
    evidence beyond what a correct answer of the same form shares: the library function's
    docstring or comments (:data:`COPY_MIN_WORDS` consecutive words the notebook does not give),
    or a body long enough (:data:`COPY_MIN_STATEMENTS`, :data:`COPY_MIN_NODES`) that is not a
    model answer's form (``model``: normalised dumps, :func:`model_forms`).

    ``notebook``: a path to an ``.ipynb`` file or a notebook dict. Answer cells are nbgrader
    solution cells; a cell that does not parse is skipped (nbgrader reports it when it runs).
    ``key``: the notebook's manifest key (default: ``<folder>/<stem>`` of a path, else unknown).
    ``given``: the library names the notebook's given code uses (default: :func:`given_names` of
    ``notebook``); ``given_text``: the text the notebook gives (default: its non-answer cells).
    ``refs``: an index of the library built earlier (a grading process builds one for all its
    notebooks), else one of ``library_dir`` is built. The check reads text only; nothing of the
    notebook runs.
    """
    cells = _cells(notebook)
    refs = refs or ReferenceIndex(library_dir)
    key = key if key is not None else _key_of(notebook)
    if given is None:
        given = given_names({"cells": cells})
    if given_text is None:
        given_text = "\n".join(_source(c) for c in cells if not _nbgrader(c).get("solution"))
    scope = copy_scope(key, given, refs.library_dir)
    known = _grams(given_text)
    model = set(model)
    findings: list[Finding] = []
    for index, cell in enumerate(cells):
        meta = _nbgrader(cell)
        if cell.get("cell_type") != "code" or not meta.get("solution"):
            continue
        source = _strip_magics(_source(cell))
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        flagged: list[tuple[int, int]] = []  # line spans of the functions reported in this cell
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    or any(a <= node.lineno <= b for a, b in flagged):  # inside a reported copy
                continue
            entries = refs.matches(node, scope)
            if not entries:
                continue
            evidence = _evidence(node, source, entries, refs, known, model)
            if evidence is not None:
                entry, why = evidence
                findings.append(Finding(str(meta.get("grade_id") or f"cell {index}"), node.name, entry.name,
                                        node.lineno, why))
                flagged.append((node.lineno, node.end_lineno or node.lineno))
    return findings


def _evidence(node, source: str, entries: list, refs: ReferenceIndex, known: set, model: set):
    """(library entry, why) when the answer function ``node`` carries evidence of copying one of
    ``entries`` beyond its form, else None."""
    words = _words(function_text(node, source))
    own = [tuple(words[i:i + COPY_MIN_WORDS]) for i in range(len(words) - COPY_MIN_WORDS + 1)]
    for entry in entries:
        library = _grams(refs.text(entry)) - known
        shared = [gram for gram in own if gram in library]  # in the answer's order
        if shared:
            return entry, f"its docstring or comments repeat the library's: \"{' '.join(shared[0])} ...\""
    if normalised(node) in model:
        return None
    size = body_size(node)
    if _long_enough(size):
        return entries[0], (f"a body of {size[0]} statements, long enough that the same code is not a "
                            "coincidence")
    return None


def main(argv=None) -> int:
    """``python -m rlhf_lab.instructor.grader.library_build NOTEBOOK...``: print suspicious copies."""
    import argparse

    ap = argparse.ArgumentParser(description="Report answer cells that copy a library function.")
    ap.add_argument("notebooks", nargs="+")
    args = ap.parse_args(argv)
    status = 0
    for path in args.notebooks:
        for finding in suspicious_copies(path):
            status = 1
            print(f"{path}: {finding}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
