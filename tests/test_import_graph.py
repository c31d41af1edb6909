"""The import graph of ``rlhf_lab``: no cycles among the instructor modules, and layers only import down.

Every import is read from the source with ``ast``, those at module level and those inside
functions alike (a function-level import hides a cycle from Python's import system, not from the
design). Relative imports are resolved against the importing module's package.

Layers, lowest first (a module may import its own layer and the ones below):

0. core: the course library students use (``ppo``, ``reward``, ``trainer``, ``sweep``, ``plots``,
   ``sequences``, ...)
1. ``judging``: the hidden tests' logic, by grade id
2. ``grading``: the in-kernel side of a hidden test cell
3. ``instructor.course``: the course object every instructor layer is handed, and ``instructor.confine``
   (standard library only: how grading runs confined as root on a root-owned course; ``course`` uses it)
4. ``instructor.grader``: grading one submission, the grader's side of the sandbox
5. ``instructor.authoring``: the source notebooks and their lint rules
6. ``instructor.classrun``: running a class (records, orchestrator, executors, pipeline, parallel; inside it
   too a module imports only those below it, :data:`CLASSRUN_ORDER`)
7. ``instructor.operations``: the instructor's week (exchange, LMS, roster, release, feedback, export)
8. the front ends: ``rlhf_lab.instructor`` itself (re-exports the pipeline) and ``rlhf_lab.demo``

Every module of ``rlhf_lab.instructor`` lives in one of these subpackages (or is ``course``,
``confine`` or ``authoring``): a new module is placed on purpose.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "helpers" / "rlhf_lab"

CORE, JUDGING, GRADING, COURSE, GRADER, AUTHORING, CLASSRUN, OPERATIONS, FRONT = range(9)
LAYER_NAMES = {CORE: "core", JUDGING: "judging", GRADING: "grading", COURSE: "instructor.course",
               GRADER: "instructor.grader", AUTHORING: "instructor.authoring", CLASSRUN: "instructor.classrun",
               OPERATIONS: "instructor.operations", FRONT: "front end"}

#: ``rlhf_lab.instructor.<part>`` -> its layer (a module or a subpackage).
INSTRUCTOR_PARTS = {"course": COURSE, "confine": COURSE, "grader": GRADER, "authoring": AUTHORING, "classrun": CLASSRUN,
                    "operations": OPERATIONS}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """``rlhf_lab`` modules imported anywhere in ``path`` (module level and inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()

    def add(target: str) -> None:
        # the longest known module that is ``target`` or contains it
        parts = target.split(".")
        while parts:
            candidate = ".".join(parts)
            if candidate in known:
                found.add(candidate)
                return
            parts.pop()

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "rlhf_lab":
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "rlhf_lab":
                continue
            for alias in node.names:  # ``from . import pipeline`` imports the module pipeline
                if f"{target}.{alias.name}" in known:
                    add(f"{target}.{alias.name}")
                else:
                    add(target)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def layer(name: str) -> int:
    parts = name.split(".")
    if parts[:2] == ["rlhf_lab", "instructor"]:
        if len(parts) == 2:
            return FRONT  # the package's own __init__ re-exports the pipeline
        assert parts[2] in INSTRUCTOR_PARTS, (
            f"place the instructor module {name} in a subpackage of a layer (tests/test_import_graph.py)")
        return INSTRUCTOR_PARTS[parts[2]]
    if parts[:2] == ["rlhf_lab", "judging"]:
        return JUDGING
    if parts[:2] == ["rlhf_lab", "grading"]:
        return GRADING
    if name in ("rlhf_lab.demo",):
        return FRONT
    return CORE


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_parser_sees_function_level_and_relative_imports(tmp_path):
    """The graph reader itself: relative imports inside a function are edges; a cycle is found."""
    known = {"rlhf_lab.instructor.a", "rlhf_lab.instructor.b", "rlhf_lab.ppo", "rlhf_lab.instructor"}
    src = tmp_path / "a.py"
    src.write_text("import os\n\ndef f():\n    from . import b\n    from ..ppo import x\n", encoding="utf-8")
    assert imports_of("rlhf_lab.instructor.a", src, known) == {"rlhf_lab.instructor.b", "rlhf_lab.ppo"}
    assert cycles({"x": {"y"}, "y": {"x"}, "z": {"x"}}) == [["x", "y"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_no_import_cycles_in_the_instructor_package():
    edges = graph()
    instr = {k: {v for v in vs if v.startswith("rlhf_lab.instructor.")}
             for k, vs in edges.items() if k.startswith("rlhf_lab.instructor.")}
    found = cycles(instr)
    assert not found, "import cycles (module or function level): " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_cycles_in_the_library():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_lower_layers_never_import_upper_ones():
    bad = []
    for name, targets in sorted(graph().items()):
        for t in sorted(targets):
            if t == "rlhf_lab" or name == "rlhf_lab":
                continue  # the package root only re-exports the core
            if layer(t) > layer(name):
                bad.append(f"{name} ({LAYER_NAMES[layer(name)]}) imports {t} ({LAYER_NAMES[layer(t)]})")
    assert not bad, "\n".join(bad)


def test_every_instructor_module_has_a_layer():
    parts = {n.split(".")[2] for n in modules() if n.startswith("rlhf_lab.instructor.")}
    unplaced = parts - set(INSTRUCTOR_PARTS)
    assert not unplaced, f"place these instructor modules in a subpackage: {sorted(unplaced)}"


#: The modules of ``instructor.classrun``, lowest first: each may import only those before it. The
#: executors (sequential in the orchestrator, Dask beside it) sit below both front ends, the course
#: command (``pipeline``, which owns the one ``ClassRun`` and its tables) and the fan-out's command
#: line (``parallel``), so neither front end reaches into the other for an executor.
CLASSRUN_ORDER = ("nbgrader_cli", "progress", "records", "orchestrator", "executors", "pipeline", "parallel")


def test_classrun_modules_import_only_the_ones_below_them():
    prefix = "rlhf_lab.instructor.classrun."
    edges = graph()
    placed = {n[len(prefix):] for n in edges if n.startswith(prefix)}
    assert placed == set(CLASSRUN_ORDER), f"place in CLASSRUN_ORDER: {sorted(placed ^ set(CLASSRUN_ORDER))}"
    bad = []
    for i, mod in enumerate(CLASSRUN_ORDER):
        for t in sorted(edges[prefix + mod]):
            if t.startswith(prefix) and CLASSRUN_ORDER.index(t[len(prefix):]) > i:
                bad.append(f"{mod} imports {t[len(prefix):]}, which sits above it")
    assert not bad, "\n".join(bad)


def test_the_layer_reader_sees_an_upward_import_inside_classrun(tmp_path):
    """The order check can fail: an executor importing the pipeline is an edge it reports."""
    known = {"rlhf_lab.instructor.classrun.executors", "rlhf_lab.instructor.classrun.pipeline"}
    src = tmp_path / "executors.py"
    src.write_text("def f():\n    from .pipeline import ClassRun\n", encoding="utf-8")
    found = imports_of("rlhf_lab.instructor.classrun.executors", src, known)
    assert found == {"rlhf_lab.instructor.classrun.pipeline"}
    assert CLASSRUN_ORDER.index("pipeline") > CLASSRUN_ORDER.index("executors")


def test_every_instructor_subpackage_says_what_it_owns_and_may_import():
    for part in ("grader", "classrun", "operations"):
        doc = (PACKAGE / "instructor" / part / "__init__.py").read_text(encoding="utf-8")
        assert "May import" in doc, part
