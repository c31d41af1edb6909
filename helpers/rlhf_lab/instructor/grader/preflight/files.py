"""What a submission folder holds besides its notebooks: planted, linked, special and oversized files.

* ``folder-link`` (block): the student's folder or assignment folder is a link or not a folder; the
  link is moved out, never followed, and the student is not graded (:func:`folder_link_findings`).
* :func:`folder_findings`, for every path under the assignment folder (``lstat`` only): ``symlink``
  and ``special-file`` (links, FIFOs, devices, sockets, hard links), ``oversized-file`` (over
  :data:`..safe_files.MAX_FILE_BYTES`, sparse or not), ``file-name`` (not UTF-8, a control
  character), ``shadow-module`` (a file or folder that would be imported instead of a real module:
  :func:`shadowable_names`), each moved out of the submission; ``extra-file`` (reported only).
  nbgrader's own ``timestamp.txt`` / ``submission_secret.txt`` are not findings.

May import :mod:`..safe_files`, :mod:`.findings` and :mod:`.names`.
"""
from __future__ import annotations

import functools
import os
import stat
import sys
from pathlib import Path

from .. import safe_files
from .findings import BLOCK, WARN, Finding
from .names import readable_rel, unusable_file_name

#: Files ``nbgrader submit`` adds to every submission in the exchange (``collect`` copies them into
#: ``submitted/``): the submission time and the secret that ties released feedback to it. They are
#: nbgrader's, not extra files of the student (small text files only; anything larger is an extra).
NBGRADER_EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")


@functools.lru_cache(maxsize=1)
def shadowable_names() -> frozenset:
    """Top-level module names an extra file beside the notebook could shadow: the standard library,
    the course's stack, and every top-level module or package on this interpreter's ``sys.path``
    (read from the folders, which takes milliseconds; ``importlib.metadata`` took over a second)."""
    names = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    names |= {"numpy", "jax", "jaxlib", "rlhf_lab", "grading", "IPython", "ipykernel", "matplotlib", "scipy",
              "nbgrader", "pytest", "sitecustomize", "usercustomize", "nbformat", "traitlets", "zmq",
              "ml_dtypes", "opt_einsum", "ipywidgets", "comm", "jupyter_client", "pandas", "torch"}
    for entry in sys.path:
        try:
            listing = os.scandir(entry or ".")
        except OSError:
            continue
        with listing:
            for item in listing:
                stem, _, suffix = item.name.partition(".")
                if not stem.isidentifier() or item.name.endswith((".dist-info", ".egg-info")):
                    continue
                if suffix in ("py", "pyc") or suffix.endswith(("so", "pyd")) or (not suffix and item.is_dir()):
                    names.add(stem)
    return frozenset(names)


def folder_link_findings(F, root: Path, student_dir: Path, folder: Path, all_autograded: tuple,
                         move_folder) -> list[Finding]:
    """The ``folder-link`` finding when the student's folder or assignment folder is a link or
    not a folder ([] when both are plain folders); the link is moved out (``move_folder(finding,
    path)``), never followed. ``F`` builds a :class:`.Finding` of this student."""
    for path in (student_dir, folder):
        try:
            st = os.lstat(path)
        except OSError:
            return []
        if stat.S_ISDIR(st.st_mode):
            continue
        what = safe_files.kind_of(st)
        rel = path.relative_to(root)
        finding = F(notebook=None, cell=None, grade_id=None, line=None, code="folder-link", severity=BLOCK,
                    withhold=all_autograded,
                    message=f"{rel} is a {what}, not a folder of the student's files; it was never "
                            "followed and this student is not graded (the rest of the class is): "
                            "collect the submission again as a plain folder and grade again")
        return [move_folder(finding, path)]
    return []


def folder_findings(F, folder: Path, shadowable: frozenset, move) -> tuple[list[Finding], dict]:
    """``(findings, {notebook file name: path})`` of the assignment folder ``folder``: every file
    that is not a top-level notebook is a finding or nbgrader's own; what must not stay is moved
    out (``move(finding, path)`` returns the finding with its action). ``F`` builds a
    :class:`.Finding` of this student."""
    out: list[Finding] = []
    present = {}
    extras = []
    for path in sorted(walk(folder)):
        rel = path.relative_to(folder)
        if any(part in (".ipynb_checkpoints", "__pycache__") for part in rel.parts):
            continue
        special = special_kind(path)
        if special.startswith("file of "):
            out.append(move(F(
                notebook=readable_rel(rel), cell=None, grade_id=None, line=None, code="oversized-file",
                severity=WARN, message=f"{readable_rel(rel)} is a {special}, more than the "
                                       f"{safe_files.MAX_FILE_BYTES // (1024 * 1024)} MiB accepted (a sparse "
                                       "file counts at the size it claims); it was never read or copied: it "
                                       "was moved out of the submission"), path))
            continue
        if special:
            out.append(move(F(
                notebook=readable_rel(rel), cell=None, grade_id=None, line=None,
                code="symlink" if special == "symbolic link" else "special-file", severity=WARN,
                message=f"{readable_rel(rel)} is a {special}; it is never followed, read or copied as its "
                        "target: it was moved out of the submission"
                        + (" (a notebook that is only a link counts as not submitted)"
                           if rel.suffix == ".ipynb" else "")), path))
            continue
        bad_name = unusable_file_name(rel)
        if bad_name:
            out.append(move(F(
                notebook=readable_rel(rel), cell=None, grade_id=None, line=None, code="file-name",
                severity=WARN, message=f"the file name {readable_rel(rel)} {bad_name}; the file was moved "
                                       "out of the submission"), path))
            continue
        if path.is_dir():
            if len(rel.parts) == 1 and rel.name in shadowable and (path / "__init__.py").exists():
                out.append(move(F(
                    notebook=str(rel), cell=None, grade_id=None, line=None, code="shadow-module",
                    severity=WARN,
                    message=f"the folder {rel}/ would be imported instead of the real '{rel.name}' module "
                            "in the student's kernel; it was moved out of the submission and the notebook "
                            "graded without it"), path))
            continue
        if len(rel.parts) == 1 and path.suffix == ".ipynb":
            present[path.name] = path
        elif len(rel.parts) == 1 and path.name in NBGRADER_EXCHANGE_FILES and os.lstat(path).st_size <= 4096:
            continue  # written by `nbgrader submit` into every exchange submission: not the student's
        else:
            extras.append((rel, path))
    for rel, path in extras:
        if len(rel.parts) == 1 and path.suffix in (".py", ".pyc", ".so", ".pth") and \
                path.stem.split(".")[0] in shadowable | {"sitecustomize", "usercustomize"} or \
                path.suffix == ".pth" or len(rel.parts) > 1 and rel.parts[0] in shadowable:
            out.append(move(F(
                notebook=str(rel), cell=None, grade_id=None, line=None, code="shadow-module", severity=WARN,
                message=f"the extra file {rel} would be imported instead of the real "
                        f"'{rel.parts[0].split('.')[0]}' module in the student's kernel; it was moved out of "
                        "the submission and the notebook graded without it"), path))
        else:
            out.append(F(notebook=str(rel), cell=None, grade_id=None, line=None, code="extra-file",
                         severity=WARN, message=f"extra file {rel} ({os.lstat(path).st_size} bytes) is not part "
                                                "of the assignment; nbgrader copies it beside the notebooks"))
    return out, present


def walk(folder: Path):
    """Every path under ``folder`` (``lstat`` only, :func:`.safe_files.walk`): plain files and folders,
    then what the walk refused (links, FIFOs, sockets, devices, hard links), never entered or opened."""
    refused: list = []
    found = [Path(p) for p, _ in safe_files.walk(folder, refused, max_bytes=None, max_links=None)]
    return found + [Path(r.path) for r in refused]


def special_kind(path: Path) -> str:
    """"symbolic link", "named pipe (FIFO)", "hard link ...", "file of N MiB" ... for anything that is
    not a plain file or folder within :data:`.safe_files.MAX_FILE_BYTES` ("" for those)."""
    try:
        st = os.lstat(path)
    except OSError:
        return ""
    found = safe_files.refusal(path, st, max_bytes=safe_files.MAX_FILE_BYTES)
    if found is None:
        return ""
    if found.kind == "hard link":
        return found.reason[len("is a "):]
    if found.kind == "too large":
        return f"file of {st.st_size / (1024 * 1024):.1f} MiB"
    return found.kind
