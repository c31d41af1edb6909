"""Names nbgrader cannot address or that need a look: student folder names and file names.

:func:`student_name_findings` gives the ``student-id-unusable`` (block: that student is not graded),
``student-id-unicode`` and ``student-id-characters`` (warn) findings of one folder name;
:func:`unusable_file_name` says why a file inside a submission cannot be kept (the ``file-name``
finding of :mod:`.files`). Names are shown on one printable line (:func:`readable_name`).
Standard library and :mod:`.findings` only.
"""
from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from .findings import BLOCK, WARN


def student_name_findings(F, student: str, all_autograded: tuple) -> tuple[list, bool]:
    """``(findings, usable)`` for the folder name ``student``; ``F`` builds a :class:`.Finding` of
    that student. Not usable: the only finding is ``student-id-unusable``, withholding
    ``all_autograded``, and nothing else of the folder is checked."""
    out = []
    shown = readable_name(student)
    unusable = unusable_name(student)
    if unusable:
        out.append(F(notebook=None, cell=None, grade_id=None, line=None, code="student-id-unusable",
                     severity=BLOCK, withhold=all_autograded,
                     message=f"the folder name {shown} {unusable}; this student is not graded (the rest of "
                             "the class is): rename the folder and grade again"))
        return out, False
    if student != unicodedata.normalize("NFC", student):
        out.append(F(notebook=None, cell=None, grade_id=None, line=None, code="student-id-unicode",
                     severity=WARN, message="the folder name is not in Unicode NFC form (often a macOS zip); "
                                            "the same student may appear twice in the gradebook"))
    if not student.isascii() or any(ch.isspace() or ch in ",;\"'" for ch in student):
        out.append(F(notebook=None, cell=None, grade_id=None, line=None, code="student-id-characters",
                     severity=WARN, message=f"the folder name {shown} has spaces, punctuation or non-ASCII "
                                            "characters; it is graded normally, check that it matches the "
                                            "roster"))
    return out, True


def readable_name(name: str) -> str:
    """``name`` quoted on one printable line: bytes that are not UTF-8 as ``\\xNN``, a newline as ``\\n``."""
    try:
        text = os.fsencode(name).decode("utf-8", "backslashreplace")
    except (UnicodeError, ValueError):
        text = name.encode("utf-8", "backslashreplace").decode("ascii")
    return "'" + "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text) + "'"


def unusable_name(name: str) -> str:
    """Why nbgrader cannot be given this folder name ("" when it can)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if any(ch in name for ch in "*?[]"):
        return "contains characters nbgrader treats as a pattern (* ? [ ])"
    if name.startswith(".") or "/" in name or "\\" in name:
        return "is a hidden or path-like name"
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        return "contains a newline or another control character"
    return ""


def unusable_file_name(rel: Path) -> str:
    """Why a file inside a submission cannot be kept ("" when it can)."""
    for part in rel.parts:
        why = unusable_name(part) if not part.startswith(".") else ""
        if why and why != "is a hidden or path-like name":
            return why
    return ""


def readable_rel(rel: Path) -> str:
    return "/".join(ascii(p)[1:-1] if unusable_name(p) else p for p in rel.parts)

