"""``nbgrader zip_collect`` for the downloads of Canvas and Moodle: file names -> roster student ids.

An LMS hands the instructor one zip of every submission, each file renamed by the LMS. nbgrader's
``zip_collect`` extracts the zip and asks a *collector plugin* which student and which notebook
each file is; its stock plugin needs one ``named_regexp`` with ``student_id`` and ``file_id``
groups, and without one it collects nothing and still exits 0. This module is the course's
plugin, :class:`LmsFileNameCollector`, configured in ``nbgrader_config.py``. It knows two naming
conventions and maps the LMS's identity of each student to the course's student id through the
roster (``examples/roster.csv`` or ``$RLHF_ROSTER``; the file ``nbgrader db student import``
reads):

=======  ========================================================================  ===================
LMS      file in the zip                                                           matched to roster
=======  ========================================================================  ===================
Canvas   ``<lastfirst>_<user id>_<submission id>_<file>``; late:                   ``lms_user_id``
         ``<lastfirst>_late_<user id>_<submission id>_<file>``; a re-upload gets   (Canvas user id)
         ``-1``, ``-2`` ... before the extension
Moodle   ``<Full Name>_<participant id>_assignsubmission_file_/<file>`` (download  ``first_name`` +
         "in folders") or the same prefix and ``<file>`` joined in one name        ``last_name``
=======  ========================================================================  ===================

Canvas names files by the student's sortable name squashed to lower case ("Lovelace, Ada" ->
``lovelaceada``) and the numeric Canvas user id, so the id is what is matched. Moodle names them
by the full name shown in Moodle and a participant id that is not stable across assignments, so
the name is matched (case, accents and repeated spaces ignored). A file that matches neither
convention, or a student missing from the roster, is skipped with a warning that names the file
and the reason; the other students are collected. The notebook name is the file name after the
LMS prefix, with a Canvas re-upload suffix removed when that gives a released notebook.

Loaded by file path from ``nbgrader_config.py`` (only the standard library, traitlets and
nbgrader are imported: nbgrader's process never imports JAX).
"""
from __future__ import annotations

import csv
import os
import re
import unicodedata
from typing import Optional

from nbgrader.plugins.zipcollect import FileNameCollectorPlugin
from traitlets import List, Unicode

#: Canvas: ``lovelaceada_12345_67890_01_losses.ipynb`` or ``lovelaceada_late_12345_67890_...``.
CANVAS_REGEXP = (r"^(?:.*/)?(?P<lms_name>[a-z0-9]+)_(?:(?P<late>late|LATE)_)?"
                 r"(?P<lms_user_id>\d+)_(?P<submission_id>\d+)_(?P<file_id>[^/]+)$")
#: Moodle: ``Ada Lovelace_4711_assignsubmission_file_/01_losses.ipynb`` (folders) or
#: ``Ada Lovelace_4711_assignsubmission_file_01_losses.ipynb`` (flat).
MOODLE_REGEXP = (r"^(?:.*/)?(?P<full_name>[^/_]+)_(?P<participant_id>\d+)_assignsubmission_file_"
                 r"(?:/|(?=[^/]+$))(?P<file_id>[^/]+)$")
LMS_REGEXPS = {"canvas": CANVAS_REGEXP, "moodle": MOODLE_REGEXP}
ROSTER_COLUMNS = ("id", "first_name", "last_name", "email", "lms_user_id")
_REUPLOAD = re.compile(r"^(?P<stem>.+)-(?P<n>\d+)(?P<ext>\.[A-Za-z0-9]+)$")


def default_roster(root: str) -> str:
    """The roster file of a course: ``<root>/roster.csv`` when it exists, else ``<root>/examples/roster.csv``."""
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a path, got {type(root).__name__}")
    own = os.path.join(os.fspath(root), "roster.csv")
    return own if os.path.exists(own) else os.path.join(os.fspath(root), "examples", "roster.csv")


def normalise_name(name: str) -> str:
    """A person's name compared loosely: accents dropped, case folded, runs of spaces collapsed."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    decomposed = unicodedata.normalize("NFKD", name)
    plain = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return " ".join(plain.casefold().split())


def canvas_name(first_name: str, last_name: str) -> str:
    """The name part of a Canvas download file: sortable name, lower case, letters and digits only."""
    return re.sub(r"[^a-z0-9]", "", normalise_name(f"{last_name}{first_name}"))


def read_roster(path: str) -> list[dict]:
    """The rows of a roster CSV (``id`` column required; the other :data:`ROSTER_COLUMNS` optional)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a path to a CSV file, got {type(path).__name__}")
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or "id" not in reader.fieldnames:
            raise ValueError(f"roster {path}: the first line must name the columns, including 'id' "
                             f"(allowed: {', '.join(ROSTER_COLUMNS)})")
        return [{k: (v or "").strip() for k, v in row.items() if k} for row in reader if (row.get("id") or "").strip()]


def parse_lms_filename(path: str) -> Optional[dict]:
    """``{"lms": "canvas"|"moodle", "file_id": ..., ...groups}`` for an LMS download file, or None."""
    if not isinstance(path, str):
        raise TypeError(f"path must be a string, got {type(path).__name__}")
    normalised = path.replace(os.sep, "/")
    for lms, pattern in LMS_REGEXPS.items():
        match = re.match(pattern, normalised)
        if match:
            return {"lms": lms, **{k: v for k, v in match.groupdict().items() if v is not None}}
    return None


def released_name(file_id: str, released: set) -> str:
    """``file_id`` with a Canvas re-upload suffix (``01_losses-1.ipynb``) removed when that names a
    released notebook; otherwise unchanged."""
    if file_id in released:
        return file_id
    match = _REUPLOAD.match(file_id)
    if match and match.group("stem") + match.group("ext") in released:
        return match.group("stem") + match.group("ext")
    return file_id


class RosterIndex:
    """Look-ups from an LMS identity to the course's student id, built from roster rows."""

    def __init__(self, rows: list):
        if not isinstance(rows, list):
            raise TypeError(f"rows must be a list of roster rows, got {type(rows).__name__}")
        self.by_lms_id, self.by_name, self.ambiguous = {}, {}, set()
        for row in rows:
            sid = row["id"]
            if row.get("lms_user_id"):
                self.by_lms_id[row["lms_user_id"]] = sid
            full = normalise_name(f"{row.get('first_name', '')} {row.get('last_name', '')}")
            if full:
                if full in self.by_name and self.by_name[full] != sid:
                    self.ambiguous.add(full)
                self.by_name[full] = sid

    def student(self, info: dict) -> tuple[Optional[str], str]:
        """``(student id, "")`` for parsed file info, or ``(None, why not)``."""
        if info["lms"] == "canvas":
            sid = self.by_lms_id.get(info["lms_user_id"])
            if sid is None:
                return None, (f"Canvas user {info['lms_user_id']} ({info['lms_name']}) is not in the roster: "
                              "add their Canvas user id in the roster's lms_user_id column")
            return sid, ""
        name = normalise_name(info["full_name"])
        if name in self.ambiguous:
            return None, f"two roster students are called {info['full_name']!r}; rename one in Moodle or the roster"
        sid = self.by_name.get(name)
        if sid is None:
            return None, (f"Moodle student {info['full_name']!r} is not in the roster (matched on "
                          "first_name + last_name)")
        return sid, ""


class LmsFileNameCollector(FileNameCollectorPlugin):
    """nbgrader ``zip_collect`` plugin for Canvas and Moodle download names (see the module docstring)."""

    roster = Unicode("", help="Roster CSV (id, first_name, last_name, email, lms_user_id) used to map "
                              "LMS identities to student ids").tag(config=True)
    released = List(Unicode(), default_value=[],
                    help="Released notebook names (set by the course; empty: every name is accepted)").tag(config=True)

    _index = None

    def index(self) -> RosterIndex:
        if self._index is None:
            if not self.roster or not os.path.exists(self.roster):
                raise FileNotFoundError(f"LmsFileNameCollector.roster: no roster file at {self.roster!r} "
                                        "(set $RLHF_ROSTER or create roster.csv)")
            self._index = RosterIndex(read_roster(self.roster))
        return self._index

    def collect(self, submitted_file: str) -> Optional[dict]:
        _, ext = os.path.splitext(submitted_file)
        if ext not in self.valid_ext:
            return None
        info = parse_lms_filename(submitted_file)
        if info is None:
            if self.named_regexp:  # an instructor's own pattern still works
                return super().collect(submitted_file)
            self.log.warning("Skipped %s: its name follows neither Canvas's nor Moodle's download naming",
                             os.path.basename(submitted_file))
            return None
        sid, why = self.index().student(info)
        if sid is None:
            self.log.warning("Skipped %s: %s", os.path.basename(submitted_file), why)
            return None
        file_id = released_name(info["file_id"], set(self.released)) if self.released else info["file_id"]
        return {"student_id": sid, "file_id": file_id}
