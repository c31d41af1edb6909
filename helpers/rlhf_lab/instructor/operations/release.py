"""``release/``: regenerate it from ``source/`` with nbgrader, check it is in sync, check nothing leaks.

* :func:`make_release` runs ``nbgrader generate_assignment NAME --force`` for every assignment of
  ``source/`` against a throwaway gradebook (regenerating the release never touches the course's
  gradebook), and removes ``release/`` folders whose source is gone.
* :func:`release_diff` regenerates into a temporary copy of the course and lists the files that
  differ from the committed ``release/``.
* Every released notebook carries the ``language_info`` of the course's kernel
  (:func:`kernel_language_info`, the values ipykernel reports in this environment). JupyterLab writes
  that into a notebook as soon as its kernel starts; a notebook without it (or with another Python
  version) therefore opens already marked as modified. Canonical comparisons ignore it.
* :func:`leaks` lists every piece of instructor-only text found in ``release/``: nbgrader's
  delimiters, the lines of solutions, hidden tests and mark schemes (each line that also appears in
  the source outside those regions is given code, not a leak).
"""
from __future__ import annotations

import filecmp
import shutil
import tempfile
from pathlib import Path

import nbformat

from ..authoring import normalised_text
from ..classrun.pipeline import PipelineError, assignments, copy_course, course_root, generate

DELIMITERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS",
              "### END HIDDEN TESTS", "BEGIN MARK SCHEME", "END MARK SCHEME")
_REGIONS = {  # begin marker -> end marker
    "BEGIN SOLUTION": "END SOLUTION",
    "BEGIN HIDDEN TESTS": "END HIDDEN TESTS",
    "BEGIN MARK SCHEME": "END MARK SCHEME",
}
MIN_LEAK_LINE = 12  # shorter lines ("return x", "pass") are too generic to call a leak


def make_release(root=None, names=None) -> list[str]:
    """Regenerate ``release/<name>/`` for each assignment in ``source/``; returns the names."""
    root = course_root(root)
    names = list(names) if names is not None else assignments(root)
    with tempfile.TemporaryDirectory(prefix="rlhf_release_db_") as tmp:
        generate(root, names, db_url="sqlite:///" + str(Path(tmp) / "gradebook.db"))
    release = root / "release"
    for child in sorted(release.iterdir()) if release.is_dir() else []:
        if child.is_dir() and child.name not in assignments(root):
            shutil.rmtree(child)
    for name in names:
        for path in sorted((release / name).rglob("*.ipynb")):
            if ".ipynb_checkpoints" not in path.parts:
                with_kernel_language_info(path)
    return names


def kernel_language_info() -> dict:
    """The ``language_info`` the course's Python kernel reports (ipykernel's, for this interpreter)."""
    from ipykernel.ipkernel import IPythonKernel

    return dict(IPythonKernel.language_info)


def with_kernel_language_info(path: Path) -> bool:
    """Give the notebook at ``path`` the kernel's ``language_info`` (so it opens unmodified); True if it changed."""
    path = Path(path)
    before = path.read_text(encoding="utf-8")
    nb = nbformat.reads(before, as_version=4)
    nb.metadata["language_info"] = kernel_language_info()
    after = nbformat.writes(nb) + "\n"
    if after != before:
        path.write_text(after, encoding="utf-8")
        return True
    return False


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts}


def release_diff(root=None) -> list[str]:
    """Relative paths under ``release/`` that differ from a fresh regeneration (empty = in sync)."""
    root = course_root(root)
    with tempfile.TemporaryDirectory(prefix="rlhf_release_check_") as tmp:
        copy = copy_course(Path(tmp) / "course", root, include=("nbgrader_config.py", "source"))
        (copy / "release").mkdir(exist_ok=True)
        make_release(copy)
        want, have = _files(copy / "release"), _files(root / "release")
        want.pop(".gitkeep", None)
        have.pop(".gitkeep", None)
        diff = [k for k in sorted(set(want) | set(have))
                if k not in want or k not in have or not _same(want[k], have[k])]
    return diff


def _same(fresh: Path, committed: Path) -> bool:
    """Byte-equal files, or notebooks equal in canonical form (what Jupyter adds when a notebook is
    opened or saved, such as the kernel's ``language_info``, does not make ``release/`` stale)."""
    if filecmp.cmp(fresh, committed, shallow=False):
        return True
    if fresh.suffix != ".ipynb":
        return False
    try:
        a, b = (nbformat.read(p, as_version=4) for p in (fresh, committed))
    except Exception:  # noqa: BLE001 - an unreadable committed notebook is simply stale
        return False
    return normalised_text(a) == normalised_text(b)


def secret_lines(source_nb) -> tuple[set, set]:
    """(instructor-only lines, lines shown to students) of a source notebook, stripped.

    Instructor-only: inside a solution, hidden-test or mark-scheme region, or a whole solution
    cell without delimiters (a written answer). Everything else in the source is public.
    """
    secret, public = set(), set()
    for cell in source_nb.cells:
        md = cell.get("metadata", {}).get("nbgrader", {})
        lines = cell.source.split("\n")
        has_region = any(b in cell.source for b in _REGIONS)
        if md.get("solution") and not has_region:
            secret.update(line.strip() for line in lines)
            continue
        end = None
        for line in lines:
            s = line.strip()
            if end is None:
                begin = next((b for b in _REGIONS if b in s), None)
                if begin is not None:
                    end = _REGIONS[begin]
                    continue
                public.add(s)
            elif end in s:
                end = None
            else:
                secret.add(s)
    return secret, public


def leaks(root=None) -> list[str]:
    """Instructor-only text found in ``release/`` (empty = clean), as ``path: problem`` strings."""
    root = course_root(root)
    found = []
    for name in assignments(root):
        rel_dir = root / "release" / name
        if not rel_dir.is_dir():
            found.append(f"release/{name}: missing")
            continue
        secret, public = set(), set()
        for src in sorted((root / "source" / name).glob("*.ipynb")):
            s, p = secret_lines(nbformat.read(src, as_version=4))
            secret |= s
            public |= p
        suspicious = {line for line in secret - public if len(line) >= MIN_LEAK_LINE}
        for path in sorted(rel_dir.rglob("*")):
            if not path.is_file():
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            if path.suffix == ".ipynb":
                nb = nbformat.reads(text, as_version=4)
                text = "\n".join(c.source for c in nb.cells) + "\n" + "\n".join(
                    str(o) for c in nb.cells for o in c.get("outputs", []))
            rel = path.relative_to(root)
            for d in DELIMITERS:
                if d in text:
                    found.append(f"{rel}: contains the delimiter {d!r}")
            release_lines = {line.strip() for line in text.split("\n")}
            for line in sorted(suspicious & release_lines):
                found.append(f"{rel}: instructor-only line {line!r}")
    return found


def check_release(root=None) -> None:
    """Raise :class:`PipelineError` if ``release/`` is out of sync with ``source/`` or leaks."""
    diff, leaked = release_diff(root), leaks(root)
    if diff or leaked:
        raise PipelineError("release/ is not clean:\n" + "\n".join(
            [f"out of sync: {d}" for d in diff] + leaked))
