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
LMS prefix, with a re-upload or copy suffix (Canvas's ``-1``, a browser's `` (1)``) removed when that
gives a released notebook. When a student uploaded one notebook more than once, the latest upload
(the highest suffix) is collected and each earlier one is reported as skipped; nbgrader's own
``zip_collect`` would stop the whole collection ("Duplicate submission file").

Canvas's ``late_`` mark is kept: such a file's submission gets a timestamp 1 second after the
assignment's due date in the gradebook (the download does not say when it came), so nbgrader shows
it late; without a due date the collector says how to set one. With ``--force`` nbgrader deletes a
student's ``submitted/<id>/<assignment>/`` (an exchange submission and its timestamp included)
before copying: the collector first copies it to ``backups/zip_collect/<UTC time>/<id>/<assignment>/``
without following anything and says where; when that copy fails the student is not collected.

What a student controls is never an identity:

* **Only the LMS's own naming decides whose a file is.** The LMS prefix must be the *first* path
  component of the member, as the LMS wrote it in its download (measured from the download's root,
  not from nbgrader's ``extracted/`` folder), and the notebook must be the file directly after it.
  A file inside a folder or an archive a student uploaded (``their.zip`` holding
  ``lovelaceada_12345_999_01_x.ipynb``, or a Moodle folder named like a classmate's) is never
  collected for anyone.
* **Identities that collide are not guessed.** Two roster rows with the same Canvas
  ``lms_user_id`` or the same normalised name (for Moodle), or two Moodle users in one download
  whose names lead to the same roster student (a display name set to a classmate's), are an error
  naming both roster lines (or both folders); neither student's files are collected, the rest of
  the class is.
* **Downloads are extracted with limits** by :class:`SafeExtractor` (``zip_collect``'s extractor,
  configured in ``nbgrader_config.py``): total size, file count, per-file size, compression ratio,
  nesting depth (0: an archive a student uploaded is left as it is), no absolute or ``..`` paths,
  no links or special files. Sizes are counted while decompressing, never taken from headers.

Loaded by file path from ``nbgrader_config.py`` (only the standard library, traitlets and
nbgrader are imported: nbgrader's process never imports JAX).
"""
from __future__ import annotations

import csv
import datetime
import os
import re
import shutil
import stat
import tarfile
import unicodedata
import zipfile
import zlib
from typing import Optional

from nbgrader.plugins.zipcollect import ExtractorPlugin, FileNameCollectorPlugin
from traitlets import Float, Int, List, TraitError, Unicode, validate

#: Canvas: ``lovelaceada_12345_67890_01_losses.ipynb`` or ``lovelaceada_late_12345_67890_...``: one
#: path component, at the root of the download.
CANVAS_REGEXP = (r"^(?P<lms_name>[a-z0-9]+)_(?:(?P<late>late|LATE)_)?"
                 r"(?P<lms_user_id>\d+)_(?P<submission_id>\d+)_(?P<file_id>[^/]+)$")
#: Moodle: ``Ada Lovelace_4711_assignsubmission_file_/01_losses.ipynb`` (a folder at the root of the
#: download, the notebook directly in it) or ``Ada Lovelace_4711_assignsubmission_file_01_losses.ipynb``
#: (flat, at the root).
MOODLE_REGEXP = (r"^(?P<full_name>[^/_]+)_(?P<participant_id>\d+)_assignsubmission_file_"
                 r"(?:/|(?=[^/]+$))(?P<file_id>[^/]+)$")
LMS_REGEXPS = {"canvas": CANVAS_REGEXP, "moodle": MOODLE_REGEXP}
ROSTER_COLUMNS = ("id", "first_name", "last_name", "email", "lms_user_id")
#: Canvas re-upload (``01_losses-1.ipynb``) and browser/Moodle copy (``01_losses (1).ipynb``) suffixes.
_REUPLOAD = re.compile(r"^(?P<stem>.+?)(?:-(?P<n>\d+)| \((?P<copy>\d+)\))(?P<ext>\.[A-Za-z0-9]+)$")
MiB = 1024 * 1024
#: Names that look like an archive, reported when a download holds one (it is never expanded by default).
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tgz", ".gz", ".bz2", ".xz", ".7z", ".rar")
_CHUNK = 64 * 1024


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
    """The rows of a roster CSV (``id`` column required; the other :data:`ROSTER_COLUMNS` optional).

    Each row also carries ``_line``, its line number in the file (the header is line 1)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a path to a CSV file, got {type(path).__name__}")
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or "id" not in reader.fieldnames:
            raise ValueError(f"roster {path}: the first line must name the columns, including 'id' "
                             f"(allowed: {', '.join(ROSTER_COLUMNS)})")
        rows = []
        for line, row in enumerate(reader, start=2):
            if (row.get("id") or "").strip():
                rows.append({**{k: (v or "").strip() for k, v in row.items() if k and k != "_line"}, "_line": line})
        return rows


def parse_lms_filename(path: str) -> Optional[dict]:
    """``{"lms": "canvas"|"moodle", "file_id": ..., ...groups}`` for an LMS download file, or None.

    ``path`` is the member's path *from the root of the LMS download*, as the LMS wrote it: the LMS
    prefix must be its first component (a file deeper down is not the LMS's naming, so None)."""
    if not isinstance(path, str):
        raise TypeError(f"path must be a string, got {type(path).__name__}")
    normalised = path.replace(os.sep, "/")
    for lms, pattern in LMS_REGEXPS.items():
        match = re.match(pattern, normalised)
        if match:
            return {"lms": lms, **{k: v for k, v in match.groupdict().items() if v is not None}}
    return None


def upload_rank(file_id: str, released: set) -> tuple[str, int]:
    """``(notebook name, upload number)`` of an LMS file name.

    A Canvas re-upload (``01_losses-2.ipynb``) or a browser's copy suffix (``01_losses (1).ipynb``,
    as Moodle keeps it) names the released notebook it copies, numbered by its suffix; the original
    name is upload 0. A name that is released as it is, or whose stem is not a released notebook, is
    itself with number 0 (with ``released`` empty every name counts as released).
    """
    if not released or file_id in released:
        return file_id, 0
    match = _REUPLOAD.match(file_id)
    if match and match.group("stem") + match.group("ext") in released:
        return match.group("stem") + match.group("ext"), int(match.group("n") or match.group("copy"))
    return file_id, 0


def released_name(file_id: str, released: set) -> str:
    """``file_id`` with a re-upload or copy suffix (``01_losses-1.ipynb``, ``01_losses (1).ipynb``)
    removed when that names a released notebook; otherwise unchanged."""
    return upload_rank(file_id, released)[0]


def _row_label(row: dict, position: int) -> str:
    """``line 4 (id 'sam_a')``: how an error names a roster row."""
    return f"line {row.get('_line', position + 2)} (id {row['id']!r})"


class RosterIndex:
    """Look-ups from an LMS identity to the course's student id, built from roster rows.

    Two rows with one Canvas ``lms_user_id``, or one normalised full name, are a collision: a file
    with that identity belongs to neither (:attr:`collisions` holds the message naming both rows).
    """

    def __init__(self, rows: list):
        if not isinstance(rows, list):
            raise TypeError(f"rows must be a list of roster rows, got {type(rows).__name__}")
        self.by_lms_id, self.by_name, self.ambiguous = {}, {}, set()
        self.collisions: dict = {}  # ("canvas", lms_user_id) or ("moodle", name) -> message
        seen_id: dict = {}
        seen_name: dict = {}
        for position, row in enumerate(rows):
            sid = row["id"]
            lms_id = row.get("lms_user_id")
            if lms_id:
                self._add(seen_id, ("canvas", lms_id), row, position, f"Canvas user id {lms_id}")
                self.by_lms_id.setdefault(lms_id, sid)
            full = normalise_name(f"{row.get('first_name', '')} {row.get('last_name', '')}")
            if full:
                shown = f"{row.get('first_name', '')} {row.get('last_name', '')}".strip()
                self._add(seen_name, ("moodle", full), row, position, f"the name {shown!r}")
                self.by_name.setdefault(full, sid)
        self.ambiguous = {key for lms, key in self.collisions if lms == "moodle"}

    def _add(self, seen: dict, key: tuple, row: dict, position: int, what: str) -> None:
        """Record ``row`` under ``key``; a second row of another student is a collision."""
        first = seen.get(key)
        if first is None:
            seen[key] = (row, position, what)
            return
        if first[0]["id"] == row["id"] or key in self.collisions:
            return
        self.collisions[key] = (f"two roster students have {first[2]}: {_row_label(first[0], first[1])} and "
                                f"{_row_label(row, position)}; no file is collected for either until the "
                                "roster (or the LMS) tells them apart")

    def collision(self, info: dict) -> Optional[str]:
        """The message naming both roster rows when the identity of parsed file info collides, else None."""
        if info["lms"] == "canvas":
            return self.collisions.get(("canvas", info["lms_user_id"]))
        return self.collisions.get(("moodle", normalise_name(info["full_name"])))

    def student(self, info: dict) -> tuple[Optional[str], str]:
        """``(student id, "")`` for parsed file info, or ``(None, why not)``."""
        collision = self.collision(info)
        if collision:
            return None, collision
        if info["lms"] == "canvas":
            sid = self.by_lms_id.get(info["lms_user_id"])
            if sid is None:
                return None, (f"Canvas user {info['lms_user_id']} ({info['lms_name']}) is not in the roster: "
                              "add their Canvas user id in the roster's lms_user_id column")
            return sid, ""
        sid = self.by_name.get(normalise_name(info["full_name"]))
        if sid is None:
            return None, (f"Moodle student {info['full_name']!r} is not in the roster (matched on "
                          "first_name + last_name)")
        return sid, ""


# --- extraction with limits -------------------------------------------------------------------


class ArchiveLimitError(Exception):
    """A download cannot be extracted within :class:`SafeExtractor`'s limits (or at all)."""


class UnreadableArchive(ArchiveLimitError):
    """An archive that is not a zip or tar tarfile can read, or is damaged."""


class _SkipMember(Exception):
    """One member of an archive is not extracted (the reason is the message)."""


def member_parts(name: str) -> tuple[Optional[list], str]:
    """The path components of an archive member name, or ``(None, why it is refused)``.

    Backslashes count as separators; ``.`` and empty components are dropped. Absolute paths,
    drive letters, ``..`` and control characters are refused."""
    raw = name.replace("\\", "/")
    if raw.startswith("/") or re.match(r"^[A-Za-z]:", raw):
        return None, "is an absolute path"
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None, "climbs out of the archive ('..' in its path)"
    if not parts:
        return None, "has an empty name"
    if any(unicodedata.category(ch) == "Cc" for ch in raw):
        return None, "has a control character in its name"
    return parts, ""


def archive_stem(filename: str) -> str:
    """The folder nbgrader extracts ``filename`` into: the name without its extension (and ``.tar``)."""
    stem, _ = os.path.splitext(os.path.basename(filename))
    inner, ext = os.path.splitext(stem)
    return inner if ext == ".tar" else stem


class _Source:
    """One archive being extracted: its label for messages, size on disk, depth, bytes written."""

    def __init__(self, path: str, label: str, depth: int):
        self.path, self.label, self.depth = path, label, depth
        self.size = os.path.getsize(path)
        self.written = 0


class SafeExtractor(ExtractorPlugin):
    """``zip_collect``'s extractor with limits (nbgrader's stock one expands archives inside archives
    without any).

    The layout is nbgrader's: ``archive/<dir>/<name>.zip`` is extracted to ``extracted/<dir>/<name>/``
    and a plain file is copied to ``extracted/<dir>/``. The whole run shares one budget of
    :attr:`max_total_bytes` decompressed bytes and :attr:`max_files` members; breaking either (or a
    tar download's :attr:`max_ratio`) stops ``zip_collect`` with an error naming the download and
    the limit, and removes what was extracted from it. A single bad member (too large, too
    compressed, a link, an absolute or ``..`` path) is skipped and reported. An archive inside the
    download is a student's upload: written as a file and reported, expanded only when
    :attr:`max_depth` allows it, and what it holds never decides whose a file is
    (:meth:`origin`).
    """

    max_total_bytes = Int(512 * MiB, help="Most bytes decompressed in one zip_collect run, all downloads "
                                          "together (counted while decompressing)").tag(config=True)
    max_files = Int(10_000, help="Most archive members (files and folders) in one zip_collect run").tag(config=True)
    max_file_bytes = Int(128 * MiB, help="Largest single extracted file; a larger member is skipped").tag(config=True)
    max_ratio = Float(100.0, help="Largest compression ratio of a member (uncompressed / compressed bytes) once "
                                  "it is larger than ratio_min_bytes; a zip member above it is skipped, a tar "
                                  "download above it (measured on the whole download) stops").tag(config=True)
    ratio_min_bytes = Int(1 * MiB, help="Size below which the compression ratio is not checked").tag(config=True)
    max_depth = Int(0, help="How many levels of archives inside the download are expanded (0: none; an "
                            "uploaded archive is left as a file and reported)").tag(config=True)

    @validate("max_total_bytes", "max_files", "max_file_bytes", "ratio_min_bytes", "max_depth", "max_ratio")
    def _non_negative(self, proposal):
        """Every limit is a number >= 0 (max_ratio > 0)."""
        value = proposal["value"]
        name = proposal["trait"].name
        if value < 0 or (name == "max_ratio" and value == 0):
            raise TraitError(f"SafeExtractor.{name} must be {'> 0' if name == 'max_ratio' else '>= 0'}, got {value}")
        return value

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.origins: dict = {}
        self.skipped: list = []
        self.extracted_root: Optional[str] = None
        self._files = 0
        self._bytes = 0

    # -- entry point ---------------------------------------------------------------------------
    def extract(self, archive_path: str, extracted_path: str) -> None:
        """Extract every download in ``archive_path`` into ``extracted_path`` (see the class docstring)."""
        self.origins, self.skipped = {}, []
        self._files = self._bytes = 0
        self.extracted_root = os.path.normpath(os.path.abspath(extracted_path))
        if not os.listdir(archive_path):
            self.log.warning("No files found in directory: %s", archive_path)
            return
        for root, dirs, files in os.walk(archive_path):
            dirs.sort()
            extract_to = os.path.normpath(os.path.join(extracted_path, os.path.relpath(root, archive_path)))
            os.makedirs(extract_to, exist_ok=True)
            for name in sorted(files):
                src = os.path.join(root, name)
                if os.path.splitext(name)[1] in self.zip_ext:
                    self._extract_download(src, extract_to, os.path.relpath(src, archive_path))
                else:
                    self._copy_plain(src, extract_to, archive_path)
        if self.skipped:
            self.log.warning("%d archive member(s) were not extracted (each is named above)", len(self.skipped))

    def origin(self, path: str) -> Optional[str]:
        """The path of an extracted file from the root of its LMS download (``/``-separated), or None
        when the LMS did not write it there (it came out of an archive inside the download)."""
        return self.origins.get(os.path.normpath(os.path.abspath(path)))

    # -- downloads -----------------------------------------------------------------------------
    def _copy_plain(self, src: str, extract_to: str, archive_path: str) -> None:
        """A file saved directly in ``archive/``: copied, its identity its path under ``archive/``."""
        dest = os.path.join(extract_to, os.path.basename(src))
        self.log.info("Copying from: %s", src)
        shutil.copy(src, dest)
        self._record(dest, os.path.relpath(src, archive_path).replace(os.sep, "/"))

    def _extract_download(self, src: str, extract_to: str, label: str) -> None:
        """Extract one LMS download; a broken limit removes its output and stops zip_collect."""
        dest = os.path.join(extract_to, archive_stem(src))
        created = not os.path.exists(dest)
        os.makedirs(dest, exist_ok=True)
        self.log.info("Extracting from: %s", src)
        self.log.info("  Extracting to: %s", dest)
        try:
            self._unpack(_Source(src, label, 0), dest)
        except ArchiveLimitError as err:
            if created:
                shutil.rmtree(dest, ignore_errors=True)
            self.origins = {k: v for k, v in self.origins.items() if not k.startswith(os.path.abspath(dest) + os.sep)}
            message = f"{src}: {err}"
            fail = getattr(self.parent, "fail", None)
            if callable(fail):
                fail(message)
            raise ArchiveLimitError(message) from None

    def _unpack(self, source: _Source, dest: str) -> None:
        """Stream the members of ``source`` (a zip, or a tar in any compression tarfile reads) into ``dest``."""
        if source.path.lower().endswith(".zip"):
            if not zipfile.is_zipfile(source.path):
                raise UnreadableArchive(f"{source.label} is not a readable zip archive; download it again from the LMS")
            self._unpack_zip(source, dest)
            return
        try:
            tf = tarfile.open(source.path, "r:*")
        except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
            raise UnreadableArchive(f"{source.label} is not a readable zip or tar archive ({err}); "
                                    "download it again from the LMS") from None
        with tf:
            try:
                self._unpack_tar(tf, source, dest)
            except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
                if isinstance(err, OSError) and err.errno is not None:
                    raise  # the disk, not the archive
                raise UnreadableArchive(f"{source.label} is damaged after {source.written} bytes ({err}); "
                                        "download it again from the LMS") from None

    def _unpack_zip(self, source: _Source, dest: str) -> None:
        """The members of a zip: links and special files refused, each size counted while inflating."""
        with zipfile.ZipFile(source.path) as zf:
            for info in zf.infolist():
                self._count_member(source)
                parts, why = member_parts(info.filename)
                if parts is None:
                    self._skip(source, info.filename, why)
                    continue
                kind = stat.S_IFMT(info.external_attr >> 16)
                if info.is_dir() or kind == stat.S_IFDIR:
                    self._mkdir(source, dest, parts, info.filename)
                    continue
                if kind == stat.S_IFLNK:
                    self._skip(source, info.filename, "is a symbolic link")
                    continue
                if kind not in (0, stat.S_IFREG):
                    self._skip(source, info.filename, "is not a regular file (a device, FIFO or socket)")
                    continue
                if info.flag_bits & 0x1:
                    self._skip(source, info.filename, "is encrypted")
                    continue
                try:
                    with zf.open(info) as stream:
                        self._write(source, dest, parts, info.filename, stream, info.compress_size)
                except (zipfile.BadZipFile, zlib.error, NotImplementedError, EOFError) as err:
                    self._skip(source, info.filename, f"cannot be read ({err})")

    def _unpack_tar(self, tf: tarfile.TarFile, source: _Source, dest: str) -> None:
        """The members of a tar: only regular files and folders (links, devices and FIFOs refused)."""
        for member in tf:
            self._count_member(source)
            parts, why = member_parts(member.name)
            if parts is None:
                self._skip(source, member.name, why)
            elif member.isdir():
                self._mkdir(source, dest, parts, member.name)
            elif member.issym() or member.islnk():
                self._skip(source, member.name, f"is a {'symbolic' if member.issym() else 'hard'} link")
            elif not member.isreg():
                self._skip(source, member.name, "is not a regular file (a device, FIFO or socket)")
            else:
                self._write(source, dest, parts, member.name, tf.extractfile(member), None)

    # -- members -------------------------------------------------------------------------------
    def _count_member(self, source: _Source) -> None:
        """One more member in this run; past :attr:`max_files` the download stops."""
        self._files += 1
        if self._files > self.max_files:
            raise ArchiveLimitError(
                f"stopped at more than {self.max_files} archive members (SafeExtractor.max_files), in "
                f"{source.label}; nothing from this download is collected. If the download is genuine, "
                f"raise the limit: nbgrader zip_collect --SafeExtractor.max_files=N")

    def _skip(self, source: _Source, member: str, why: str) -> None:
        """Report one member that is not extracted."""
        self.skipped.append((source.label, member, why))
        self.log.warning("Skipped %r in %s: it %s; the member was not extracted", member, source.label, why)

    def _target(self, dest: str, parts: list) -> str:
        """The file a member is written to, checked to lie inside ``dest``."""
        target = os.path.normpath(os.path.join(dest, *parts))
        if os.path.commonpath([os.path.abspath(dest), os.path.abspath(target)]) != os.path.abspath(dest):
            raise _SkipMember("lies outside the extraction folder")
        return target

    def _mkdir(self, source: _Source, dest: str, parts: list, member: str) -> None:
        """A folder member (created inside ``dest`` only)."""
        try:
            os.makedirs(self._target(dest, parts), exist_ok=True)
        except (_SkipMember, OSError) as err:
            self._skip(source, member, str(err) if isinstance(err, _SkipMember) else
                       "is a folder where a file of that name was already extracted")

    def _write(self, source: _Source, dest: str, parts: list, member: str, stream, compressed) -> None:
        """Write one member, counting its bytes as they are decompressed (never from its header)."""
        try:
            target = self._target(dest, parts)
        except _SkipMember as err:
            self._skip(source, member, str(err))
            return
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            self._skip(source, member, "lies in a folder whose name is a file already extracted")
            return
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except FileExistsError:
            self._skip(source, member, "has the name of a file or folder already extracted (a second member of that name)")
            return
        except IsADirectoryError:
            self._skip(source, member, "has the name of a folder already extracted")
            return
        try:
            with os.fdopen(fd, "wb") as out:
                self._copy_counted(source, stream, out, compressed)
        except _SkipMember as err:
            os.unlink(target)
            self._skip(source, member, str(err))
            return
        except BaseException:
            os.unlink(target)
            raise
        self._after_write(source, target, parts, member)

    def _copy_counted(self, source: _Source, stream, out, compressed) -> None:
        """Copy ``stream`` to ``out`` in chunks; per-member limits skip it, run limits stop the download."""
        written = 0
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                return
            written += len(chunk)
            self._bytes += len(chunk)
            source.written += len(chunk)
            if self._bytes > self.max_total_bytes:
                raise ArchiveLimitError(
                    f"stopped at more than {self.max_total_bytes} decompressed bytes "
                    f"({self.max_total_bytes / MiB:g} MiB, SafeExtractor.max_total_bytes), in {source.label}; "
                    "nothing from this download is collected. If the download is genuine, raise the limit: "
                    "nbgrader zip_collect --SafeExtractor.max_total_bytes=N")
            if written > self.max_file_bytes:
                raise _SkipMember(f"is larger than {self.max_file_bytes} bytes (SafeExtractor.max_file_bytes)")
            if compressed is not None and written > self.ratio_min_bytes and written > self.max_ratio * max(compressed, 1):
                raise _SkipMember(f"decompresses to more than {self.max_ratio:g} times its compressed size of "
                                  f"{compressed} bytes (SafeExtractor.max_ratio): a compression bomb?")
            if compressed is None and source.written > self.ratio_min_bytes and source.written > self.max_ratio * max(source.size, 1):
                raise ArchiveLimitError(
                    f"decompresses to more than {self.max_ratio:g} times its size of {source.size} bytes "
                    f"(SafeExtractor.max_ratio), in {source.label}: a compression bomb? Nothing from this "
                    "download is collected")
            out.write(chunk)

    def _after_write(self, source: _Source, target: str, parts: list, member: str) -> None:
        """Record a member the LMS wrote; an archive inside it is reported, expanded only within max_depth."""
        if source.depth == 0:
            self._record(target, "/".join(parts))
        if not parts[-1].lower().endswith(ARCHIVE_SUFFIXES):
            return
        if source.depth >= self.max_depth or os.path.splitext(parts[-1])[1] not in self.zip_ext:
            self.log.warning("Left %r in %s as it is: an archive inside the download is a student's upload and "
                             "is not expanded (SafeExtractor.max_depth = %d); nothing in it is collected",
                             member, source.label, self.max_depth)
            return
        inner = _Source(target, f"{source.label} > {member}", source.depth + 1)
        folder = os.path.join(os.path.dirname(target), archive_stem(target))
        self.log.warning("Expanding %s into %s (SafeExtractor.max_depth = %d); its files decide no student's "
                         "identity", inner.label, folder, self.max_depth)
        os.makedirs(folder, exist_ok=True)
        try:
            self._unpack(inner, folder)
        except UnreadableArchive as err:
            self._skip(source, member, f"is an archive that cannot be expanded ({err})")

    def _record(self, path: str, lms_path: str) -> None:
        """Remember that the LMS wrote ``path`` as ``lms_path`` (from its download's root)."""
        self.origins[os.path.normpath(os.path.abspath(path))] = lms_path


def layout_origin(path: str, archive_dir: str, extracted_dir: str, zip_ext) -> Optional[str]:
    """The path of an extracted file from its download's root, from nbgrader's ``extracted/`` layout.

    Used when the extractor is not :class:`SafeExtractor` (it keeps no record): a download
    ``archive/<dir>/<name>.zip`` was extracted to ``extracted/<dir>/<name>/``, a plain file
    ``archive/<dir>/<file>`` copied to ``extracted/<dir>/<file>``; without ``archive/`` the instructor
    filled ``extracted/`` by hand and it is the download's root. None when nothing explains the file."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(extracted_dir))
    parts = rel.replace(os.sep, "/").split("/")
    if not parts or parts[0] == "..":
        return None
    if not os.path.isdir(archive_dir):  # nothing was extracted: the instructor filled extracted/ by hand
        return "/".join(parts)
    for i in range(len(parts) - 1):
        folder = os.path.join(archive_dir, *parts[:i])
        names = os.listdir(folder) if os.path.isdir(folder) else []
        if any(os.path.splitext(n)[1] in zip_ext and archive_stem(n) == parts[i]
               and os.path.isfile(os.path.join(folder, n)) for n in names):
            return "/".join(parts[i + 1:])
    if os.path.isfile(os.path.join(archive_dir, *parts)):
        return "/".join(parts)
    return None


def _safe_files():
    """``grader/safe_files.py`` (standard library only), loaded by its path like this module."""
    import importlib.util
    import sys

    name = "rlhf_lab_course_safe_files"
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "grader", "safe_files.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class LmsFileNameCollector(FileNameCollectorPlugin):
    """nbgrader ``zip_collect`` plugin for Canvas and Moodle download names (see the module docstring)."""

    roster = Unicode("", help="Roster CSV (id, first_name, last_name, email, lms_user_id) used to map "
                              "LMS identities to student ids").tag(config=True)
    released = List(Unicode(), default_value=[],
                    help="Released notebook names (set by the course; empty: every name is accepted)").tag(config=True)

    _index = None
    _contested = None
    _reported = None
    _latest = None
    _due = None
    _backed_up = None
    _run_stamp = None

    def index(self) -> RosterIndex:
        if self._index is None:
            if not self.roster or not os.path.exists(self.roster):
                raise FileNotFoundError(f"LmsFileNameCollector.roster: no roster file at {self.roster!r} "
                                        "(set $RLHF_ROSTER or create roster.csv)")
            self._index = RosterIndex(read_roster(self.roster))
        return self._index

    # -- where a file came from ----------------------------------------------------------------
    def _dirs(self) -> tuple[Optional[str], Optional[str]]:
        """``(archive dir, extracted dir)`` of the running ``zip_collect``, or ``(None, None)``."""
        fmt = getattr(self.parent, "_format_collect_path", None)
        if not callable(fmt):
            return None, None
        return fmt(self.parent.archive_directory), fmt(self.parent.extracted_directory)

    def lms_path(self, submitted_file: str) -> Optional[str]:
        """The file's path from the root of its LMS download, or None if the LMS did not write it there."""
        extractor = getattr(self.parent, "extractor_plugin_inst", None)
        if isinstance(extractor, SafeExtractor) and extractor.extracted_root is not None:
            return extractor.origin(submitted_file)
        archive_dir, extracted_dir = self._dirs()
        if extracted_dir is None:
            return submitted_file.replace(os.sep, "/")  # called on its own: the path is the member's path
        zip_ext = getattr(extractor, "zip_ext", [".zip", ".gz"])
        return layout_origin(submitted_file, archive_dir, extracted_dir, zip_ext)

    def _shown(self, submitted_file: str) -> str:
        """The file's name in messages: its path under ``extracted/`` when known."""
        _, extracted_dir = self._dirs()
        if extracted_dir:
            rel = os.path.relpath(os.path.abspath(submitted_file), os.path.abspath(extracted_dir))
            if not rel.startswith(".."):
                return rel
        return os.path.basename(submitted_file)

    def _all_lms_paths(self) -> list:
        """Every LMS path of this run's download(s), for the Moodle name check."""
        extractor = getattr(self.parent, "extractor_plugin_inst", None)
        if isinstance(extractor, SafeExtractor) and extractor.extracted_root is not None:
            return sorted(extractor.origins.values())
        _, extracted_dir = self._dirs()
        if not extracted_dir or not os.path.isdir(extracted_dir):
            return []
        found = []
        for root, _, files in os.walk(extracted_dir):
            found.extend(p for p in (self.lms_path(os.path.join(root, f)) for f in files) if p)
        return sorted(found)

    def contested(self) -> dict:
        """``{student id: message}`` for students whom two Moodle users of the download map to (two
        participant ids whose names are the same roster student: one of them took a classmate's name)."""
        if self._contested is None:
            claims: dict = {}
            for path in self._all_lms_paths():
                info = parse_lms_filename(path)
                if info is None or info["lms"] != "moodle":
                    continue
                sid, _ = self.index().student(info)
                if sid is not None:
                    marker = "_assignsubmission_file_"
                    folder = path.split("/")[0] if "/" in path else path[: path.index(marker) + len(marker)]
                    claims.setdefault(sid, {}).setdefault(info["participant_id"], folder)
            self._contested = {
                sid: (f"{len(by_id)} Moodle users of this download map to roster student {sid!r}: "
                      + ", ".join(repr(f) for f in by_id.values())
                      + " (one of them may have taken a classmate's display name); no file is collected for "
                      f"{sid} by guessing: check the participant ids {', '.join(sorted(by_id))} in Moodle and "
                      "copy the right notebooks into submitted/ by hand")
                for sid, by_id in claims.items() if len(by_id) > 1}
        return self._contested

    def latest_uploads(self) -> dict:
        """``{(student id, notebook): LMS path}``: the latest upload of each notebook of each student.

        An LMS keeps every upload: Canvas numbers a re-upload ``-1``, ``-2`` ...; a browser that saves
        a second copy writes ``(1)``. The highest number is the student's latest upload and is the one
        collected; the others are reported (nbgrader's own ``zip_collect`` stops the whole collection
        on two files of one notebook: "Duplicate submission file").
        """
        if self._latest is None:
            best: dict = {}
            released = set(self.released)
            for path in self._all_lms_paths():
                info = parse_lms_filename(path)
                if info is None or os.path.splitext(path)[1] not in self.valid_ext:
                    continue
                sid, _ = self.index().student(info)
                if sid is None:
                    continue
                name, rank = upload_rank(info["file_id"], released)
                key = (sid, name)
                if key not in best or (rank, path) > best[key]:
                    best[key] = (rank, path)
            self._latest = {key: path for key, (_, path) in best.items()}
        return self._latest

    def _refuse(self, key, message: str, shown: str, short: str) -> None:
        """Log a collision once as an error (``message``), and each file it costs as a warning (``short``)."""
        self._reported = self._reported if self._reported is not None else set()
        if key not in self._reported:
            self._reported.add(key)
            self.log.error("Not collected: %s", message)
        self.log.warning("Skipped %s: %s (see the error above)", shown, short)

    def collect(self, submitted_file: str) -> Optional[dict]:
        _, ext = os.path.splitext(submitted_file)
        if ext not in self.valid_ext:
            return None
        shown = self._shown(submitted_file)
        lms_path = self.lms_path(submitted_file)
        if lms_path is None:
            self.log.warning("Skipped %s: it is not a file of the LMS download itself (it came out of an archive "
                             "inside the download, e.g. one a student uploaded), so its name decides no student", shown)
            return None
        info = parse_lms_filename(lms_path)
        if info is None:
            if self.named_regexp:  # an instructor's own pattern still works
                return super().collect(submitted_file)
            where = (" (the LMS's name must be the first folder or file of the download; this one lies deeper, "
                     "inside a folder a student uploaded)" if "/" in lms_path else "")
            self.log.warning("Skipped %s: its name follows neither Canvas's nor Moodle's download naming%s",
                             shown, where)
            return None
        sid, why = self.index().student(info)
        if sid is None:
            if self.index().collision(info):
                self._refuse(("roster", why), why, shown, "two roster students have this file's LMS identity")
            else:
                self.log.warning("Skipped %s: %s", shown, why)
            return None
        if sid in self.contested():
            self._refuse(("download", sid), self.contested()[sid], shown,
                         f"two Moodle users of this download map to roster student {sid!r}")
            return None
        file_id, rank = upload_rank(info["file_id"], set(self.released))
        latest = self.latest_uploads().get((sid, file_id))
        if latest is not None and latest != lms_path:
            self.log.warning("Skipped %s: an earlier upload of %s by %s; the latest one, %s, is collected",
                             shown, file_id, sid, latest)
            return None
        if not self._backed_up_before_force(sid):
            return None
        if rank:
            self.log.info("Collected %s as %s for %s (its latest upload)", shown, file_id, sid)
        found = {"student_id": sid, "file_id": file_id}
        if info.get("late"):
            stamp = self._late_timestamp()
            if stamp is not None:
                found["timestamp"] = stamp
                self.log.warning("Collected %s for %s as LATE (Canvas marks it late; the download does not say "
                                 "when it came, so it is recorded as 1 second after the due date, %s)",
                                 shown, sid, stamp.replace(microsecond=0) - datetime.timedelta(seconds=1))
            else:
                self.log.warning("Canvas marks %s late, but assignment %r has no due date in the gradebook, so "
                                 "nbgrader cannot show it late: set one (nbgrader db assignment add %s "
                                 "--duedate=...) and collect again with --force", shown, self._assignment(),
                                 self._assignment())
        return found

    # -- late files and what --force would delete ----------------------------------------------
    def _assignment(self) -> str:
        coursedir = getattr(self.parent, "coursedir", None)
        return getattr(coursedir, "assignment_id", "") or ""

    def _late_timestamp(self) -> Optional[datetime.datetime]:
        """One second after the assignment's due date in the gradebook (naive UTC, as nbgrader stores
        it), or None when the gradebook has no due date for it. Read once per run."""
        if self._due is None:
            self._due = (None,)
            coursedir = getattr(self.parent, "coursedir", None)
            url = getattr(coursedir, "db_url", "") or ""
            path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else None
            if coursedir is not None and url and (path is None or os.path.isfile(path)):
                from nbgrader.api import Gradebook, MissingEntry

                try:
                    with Gradebook(url, course_id=getattr(coursedir, "course_id", "") or "default_course") as gb:
                        due = gb.find_assignment(self._assignment()).duedate
                except MissingEntry:
                    due = None
                self._due = (due,)
        due = self._due[0]
        return None if due is None else due + datetime.timedelta(seconds=1)

    def _backed_up_before_force(self, sid: str) -> bool:
        """With ``--force``, nbgrader deletes ``submitted/<sid>/<assignment>/`` (an exchange submission
        and its timestamp included) before copying the LMS file in. Copy it first, without following
        anything a student planted, to ``backups/zip_collect/<UTC time>/<sid>/<assignment>/``, and
        say so. False (the student is not collected) when the copy fails: nothing is deleted unbacked."""
        coursedir = getattr(self.parent, "coursedir", None)
        if not getattr(self.parent, "force", False) or coursedir is None:
            return True
        self._backed_up = self._backed_up if self._backed_up is not None else {}
        if sid in self._backed_up:
            return self._backed_up[sid]
        assignment = self._assignment()
        current = coursedir.format_path(coursedir.submitted_directory, sid, assignment)
        ok = True
        if os.path.isdir(current) and not os.path.islink(current) and os.listdir(current):
            if self._run_stamp is None:
                self._run_stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
            dest = os.path.join(coursedir.root, "backups", "zip_collect", self._run_stamp, sid, assignment)
            try:
                safe_files = _safe_files()
                safe_files.add_course_root(coursedir.root)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                refused: list = []
                safe_files.copy_tree_safely(current, dest, refused=refused)
                for item in refused:
                    self.log.warning("Backup of %s: %s", sid, getattr(item, "message", item))
                self.log.warning("zip_collect --force replaces %s's submission of %s; what was there (timestamp.txt "
                                 "included) is backed up in %s", sid, assignment, dest)
            except (OSError, ValueError) as exc:
                ok = False
                self.log.error("Not collected for %s: --force would delete %s, and backing it up failed (%s); "
                               "nothing of %s was changed", sid, current, exc, sid)
        self._backed_up[sid] = ok
        return ok
