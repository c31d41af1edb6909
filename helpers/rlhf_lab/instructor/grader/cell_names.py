"""Which answer cells a function defined in a notebook depends on (text only: nothing runs).

The authoring lint (:func:`rlhf_lab.instructor.authoring.read_answer_cells`) asks, for each hidden
check, which answer cells provide the functions and values the check reads: :func:`needed_cells`
walks up from the test cell, through the cells that bind a needed name and, transitively, the names
those cells read from the notebook's namespace.
"""
from __future__ import annotations

import ast

#: Methods that change the object they are called on (``x.append(...)`` binds ``x`` for this walk).
MUTATING_METHODS = frozenset(("append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear",
                              "remove", "add", "discard", "sort", "reverse", "fill", "resize", "put",
                              "__setitem__", "__delitem__", "__setattr__"))


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """``(every name the cell binds or mutates, names bound unconditionally at its top level)``."""
    bound, sure = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound.add("*" if alias.name == "*" else (alias.asname or alias.name.split(".")[0]))
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            root = _root(node)
            if root:
                bound.add(root)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MUTATING_METHODS:
            root = _root(node.func.value)
            if root:
                bound.add(root)
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            sure.add(stmt.name)
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            sure.update(t.id for t in stmt.targets)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            sure.update(a.asname or a.name.split(".")[0] for a in stmt.names if a.name != "*")
    return bound, sure


def _used_names(tree: ast.Module, source: str | None = None) -> set[str]:
    """The names a cell reads from the notebook's namespace: those it reads at its top level, and
    those its functions, classes and comprehensions read as globals (:mod:`symtable`). A function's
    own parameters and locals are not read from the namespace, so an earlier cell that happens to
    bind a variable of the same name (``beta``, ``mask``) is not needed for it. Without ``source``
    (or when :mod:`symtable` cannot read it), every name the cell loads anywhere."""
    if source is not None:
        import symtable

        try:
            top = symtable.symtable(source, "<cell>", "exec")
        except (SyntaxError, ValueError):
            top = None
        if top is not None:
            out: set[str] = set()
            stack = [top]
            while stack:
                table = stack.pop()
                for sym in table.get_symbols():
                    if sym.is_referenced() and (table.get_type() == "module" or sym.is_global()):
                        out.add(sym.get_name())
                stack.extend(table.get_children())
            return out
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def python_source(source: str) -> str:
    """A cell's source as plain Python (IPython magics turned into ``get_ipython()`` calls)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # pragma: no cover - nbgrader always brings IPython
        return source
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - the cell then fails to compile in the runtime, as in a kernel
        return source


def is_test_cell(cell) -> bool:
    """An nbgrader test cell (graded, not an answer): never run by the runtime."""
    meta = (cell.get("metadata") or {}).get("nbgrader") or {}
    return bool(meta.get("grade")) and not meta.get("solution")


def needed_cells(cells, upto: int, name: str) -> list[int]:
    """Indices of the code cells above ``upto`` (test cells excluded) that ``name`` needs, in order.

    Walking up from the test cell: a cell is needed when it binds or mutates a name still needed
    (``def``, assignment, import, ``x[...] =``, ``x.attr =``, ``x.append(...)``...); then the names it
    reads from the namespace are needed too (:func:`_used_names`: not its functions' own locals), and
    a name it binds unconditionally at its top level is satisfied. A cell
    that ``import *`` counts as binding everything; a cell that does not parse is skipped (it would
    fail in the kernel too).
    """
    need, chosen = {name}, []
    for index in range(min(upto, len(cells)) - 1, -1, -1):
        cell = cells[index]
        if cell.get("cell_type") != "code" or is_test_cell(cell):
            continue
        source = python_source(cell.get("source", ""))
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        bound, sure = _bound_names(tree)
        if not (bound & need or "*" in bound):
            continue
        chosen.append(index)
        need = (need - sure) | _used_names(tree, source)
    return sorted(chosen)
