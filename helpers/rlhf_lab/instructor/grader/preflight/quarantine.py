"""Moving files out of a submission, and keeping the original of a notebook repaired in place.

Files that must not run (links, special and oversized files, shadowing modules, notebooks that are
not JSON or belong to another assignment) go to ``integrity/quarantine/<student>/<assignment>/``,
each with a ``.finding.json`` saying why; a repaired notebook is rewritten in place and its
original kept there as ``<notebook>.before-repair``. Only ``lstat`` and ``rename`` touch a moved
path (:func:`..safe_files.move_aside`). With ``enabled=False`` nothing is moved or written: the
findings are returned unchanged. May import :mod:`..safe_files`, nbformat and :mod:`.findings`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import nbformat

from .. import safe_files
from .findings import QUARANTINE, Finding

#: Largest notebook the pre-flight reads (a larger one is an ``invalid-notebook``).
MAX_NOTEBOOK_BYTES = safe_files.MAX_FILE_BYTES


class Quarantine:
    """The quarantine folder of one assignment in one course (``enabled=False``: report only)."""

    def __init__(self, root: Path, assignment: str, enabled: bool):
        self.root = root
        self.assignment = assignment
        self.enabled = enabled

    def folder(self, student: str) -> Path:
        return self.root / QUARANTINE / student / self.assignment

    def move(self, finding: Finding, student: str, path: Path) -> Finding:
        """Move ``path`` (the link itself, never its target) to the quarantine folder; record why.

        Only ``lstat`` and ``rename`` touch it (:func:`..safe_files.move_aside`): across file systems
        a link or special file is removed, never copied as its target."""
        if not self.enabled:
            return finding
        dest_dir = self.folder(student)
        moved = safe_files.move_aside(path, dest_dir)
        dest = Path(moved) if moved is not None else None
        where = f"moved to {dest.relative_to(self.root)}" if dest is not None else "removed"
        finding = dataclasses.replace(finding, action=where)
        (dest_dir / (path.name + ".finding.json")).write_text(json.dumps(finding.to_dict(), indent=1) + "\n")
        return finding

    def move_folder(self, finding: Finding, student: str, path: Path) -> Finding:
        """Move a student's (or assignment) folder that is a link out of ``submitted/`` (never followed)."""
        if not self.enabled:
            return finding
        moved = safe_files.move_aside(path, self.folder(student) / ".folder")
        return dataclasses.replace(finding, action=f"moved to {Path(moved).relative_to(self.root)}"
                                   if moved else "removed")

    def save_repair(self, student: str, path: Path, repaired, findings: list, repairs: set) -> list:
        """Write the repaired notebook in place (the original goes to quarantine); mark the findings."""
        dest_dir = self.folder(student)
        dest_dir.mkdir(parents=True, exist_ok=True)
        original = dest_dir / (path.name + ".before-repair")
        if os.path.lexists(original):
            os.unlink(original)
        safe_files.copy_file_safely(path, original, MAX_NOTEBOOK_BYTES)
        # a new file renamed over the old name: never written through a link swapped in meanwhile
        safe_files.write_bytes_replacing(path, (nbformat.writes(repaired) + "\n").encode("utf-8"))
        out = []
        k = 0
        for f in findings:
            if f.code in repairs:
                f = dataclasses.replace(f, action=f"repaired in place (original kept as {original.relative_to(self.root)})")
                (dest_dir / f"{path.name}.repair-{k}.finding.json").write_text(json.dumps(f.to_dict(), indent=1) + "\n")
                k += 1
            out.append(f)
        return out
