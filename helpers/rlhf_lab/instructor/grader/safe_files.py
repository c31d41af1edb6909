"""Reading, copying and walking files a student could have planted, without ever being fooled by them.

The grader runs as root outside the sandbox, and every folder under ``submitted/``, ``autograded/``,
``feedback/`` and the exchange's ``inbound/`` holds files a student chose. A symbolic link there
would make a plain ``open``/``copy``/``chmod`` act on its target (the gradebook, ``source/``, the
grader's guide); a FIFO makes a plain ``open`` wait forever; a hard link is a second name of a file
elsewhere; a sparse file claims gigabytes it does not occupy and becomes that many real bytes when
copied. This module is the one place that touches such paths:

* :func:`walk` visits a folder through directory file descriptors (``O_NOFOLLOW``), ``lstat``-ing
  every entry: it yields regular files and folders only and reports everything else (links,
  FIFOs, sockets, devices, files with more than one hard link) as a :class:`Refusal`;
* :func:`open_regular` opens with ``O_RDONLY | O_NOFOLLOW | O_NONBLOCK`` and checks with
  ``fstat`` that the file it actually got is a regular file within a size bound (the apparent
  size, so a sparse file counts at the size it claims): a FIFO can never block, a link is never
  followed, and a swap between a check and the open changes nothing;
* :func:`copy_tree_safely` copies a folder without following anything, creating every entry of
  the copy with ``O_EXCL | O_NOFOLLOW`` (so a link planted at the destination is never written
  through), within a total size bound;
* :func:`check_no_links` lists what :func:`walk` would refuse.

Every refusal names the student (read from the path, ``<root>/<submitted|autograded|feedback>/
<student>/<assignment>/...`` or an exchange submission ``<student>+<assignment>+...``) and the file,
and says what to do. Standard library only: ``nbgrader_config.py`` and the hooks it installs load
this file by its path.
"""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import stat
from pathlib import Path

#: Largest single file accepted from a student folder (nbgrader's own exchange limit is 100 MB).
MAX_FILE_BYTES = 100 * 1024 * 1024
#: Largest total of one submission (all its files, apparent sizes).
MAX_TOTAL_BYTES = 500 * 1024 * 1024
#: The course's top-level folders that hold one sub-folder per student.
STUDENT_AREAS = ("submitted", "autograded", "feedback")

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
_CREATE_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0))


# ----------------------------------------------------------------------------------- who and what
#: Course roots this process works on (registered by the hooks and the pre-flight): student ids and
#: the paths in messages are read relative to them; ``$RLHF_COURSE_ROOT`` counts too.
COURSE_ROOTS: set = set()


def add_course_root(root) -> None:
    """Read student ids (and show paths) relative to ``root`` from now on."""
    COURSE_ROOTS.add(os.path.abspath(os.fspath(root)))


def _roots() -> list[str]:
    env = os.environ.get("RLHF_COURSE_ROOT")
    roots = COURSE_ROOTS | ({os.path.abspath(env)} if env else set())
    return sorted(roots, key=len, reverse=True)


def _relative(path: str) -> tuple[str, ...] | None:
    for root in _roots():
        if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
            return Path(os.path.relpath(path, root)).parts
    return None


def student_of(path) -> str | None:
    """The student a path belongs to: the folder after ``submitted``/``autograded``/``feedback`` of the
    course, or the first part of an exchange submission's name (``student+assignment+timestamp+random``).

    Relative to a known course root when the path is under one; otherwise the first such folder
    from the start that still has a student and an assignment folder after it (a student's own
    sub-folder named ``feedback``, where nbgrader fetches feedback to, comes later).
    """
    full = os.path.abspath(os.fspath(path))
    rel = _relative(full)
    if rel and len(rel) >= 2 and rel[0] in STUDENT_AREAS:
        return rel[1]
    parts = Path(full).parts
    for i in range(len(parts) - 1):
        if parts[i] == "inbound" and "+" in parts[i + 1]:
            return parts[i + 1].split("+", 1)[0]
    for need in (2, 1):
        for i in range(len(parts) - need):
            if parts[i] in STUDENT_AREAS:
                return parts[i + 1]
    return None


def shown(path) -> str:
    """``path`` relative to its course root when known (how a person finds it), else as given."""
    full = os.path.abspath(os.fspath(path))
    rel = _relative(full)
    return os.path.join(*rel) if rel else os.fspath(path)


def kind_of(st: os.stat_result) -> str:
    """What an ``lstat`` result is, in words ("symbolic link", "named pipe (FIFO)", ...)."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISREG(mode):
        return "regular file"
    return "special file"


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


@dataclasses.dataclass(frozen=True)
class Refusal:
    """One path that was not read, copied or followed, and why."""

    path: str  # the path as it was found
    kind: str  # "symbolic link", "named pipe (FIFO)", "hard link", "too large", ...
    reason: str  # plain words: what the file is
    student: str | None = None

    @property
    def message(self) -> str:
        who = f"student {self.student!r}" if self.student else "an unknown student"
        return (f"{who}: {shown(self.path)} {self.reason}; it was not read, copied or followed (the student's other "
                "files are handled as usual). Look at it, and remove it or ask the student to submit "
                "without it")


class UnsafeFileError(OSError):
    """A path that must not be read, copied or followed (a link, a FIFO, a device, a hard link, too large).

    An :class:`OSError`, so code that already handles unreadable files handles this one; the
    :attr:`refusal` says who and what.
    """

    def __init__(self, refusal: Refusal):
        super().__init__(errno.EPERM, refusal.message)
        self.refusal = refusal
        self.filename = refusal.path

    @property
    def student(self) -> str | None:
        return self.refusal.student

    @property
    def kind(self) -> str:
        return self.refusal.kind

    def __str__(self) -> str:
        return self.refusal.message


def refusal(path, st: os.stat_result | None = None, *, kind: str | None = None, reason: str | None = None,
            max_bytes: int | None = None, max_links: int | None = 1) -> Refusal | None:
    """Why ``path`` (with its ``lstat`` result ``st``) must be refused, or None when it is a plain
    regular file or folder within the bounds."""
    path = os.fspath(path)
    who = student_of(path)
    if kind is not None:
        return Refusal(path, kind, reason or f"is a {kind}", who)
    if st is None:
        st = os.lstat(path)
    what = kind_of(st)
    if what == "folder":
        return None
    if what != "regular file":
        return Refusal(path, what, f"is a {what}", who)
    if max_links is not None and st.st_nlink > max_links:
        return Refusal(path, "hard link", f"is a hard link (the same file has {st.st_nlink} names, so it may be "
                                          "a file from outside the student's folder)", who)
    if max_bytes is not None and st.st_size > max_bytes:
        return Refusal(path, "too large", f"is {_mib(st.st_size)}, more than the {_mib(max_bytes)} accepted "
                                          "(a sparse file counts at the size it claims)", who)
    return None


def _raise_or_note(found: Refusal, refused: list | None) -> None:
    if refused is None:
        raise UnsafeFileError(found)
    refused.append(found)


# ----------------------------------------------------------------------------------------- reading
def open_regular(path, max_bytes: int = MAX_FILE_BYTES, *, dir_fd: int | None = None, max_links: int | None = 1):
    """A binary file object of ``path``, which must be a regular file of at most ``max_bytes``.

    Opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked with ``fstat`` on the descriptor itself, so
    a link is never followed, a FIFO never blocks and nothing swapped in after a check gets read.
    ``max_links=None`` accepts hard links (for files outside student folders). Raises
    :class:`UnsafeFileError` naming the student and the file, or the usual :class:`OSError`.
    """
    shown = os.fspath(path)
    before = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    found = refusal(shown, before, max_bytes=max_bytes, max_links=max_links)
    if found is not None or stat.S_ISDIR(before.st_mode):  # never open a device, even to look at it
        raise UnsafeFileError(found or refusal(shown, kind="folder", reason="is a folder, not a file"))
    try:
        fd = os.open(path, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # the last component is a link
            raise UnsafeFileError(refusal(shown, kind="symbolic link")) from None
        if exc.errno == errno.ENXIO:  # a socket (or a FIFO opened for writing)
            raise UnsafeFileError(refusal(shown, kind="socket")) from None
        raise
    try:
        found = refusal(shown, os.fstat(fd), max_bytes=max_bytes, max_links=max_links)
        if found is not None:
            raise UnsafeFileError(found)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path, max_bytes: int = MAX_FILE_BYTES, *, max_links: int | None = 1) -> bytes:
    """The bytes of a regular file (see :func:`open_regular`); never more than ``max_bytes``."""
    with open_regular(path, max_bytes, max_links=max_links) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew after the check
        raise UnsafeFileError(refusal(path, kind="too large", reason=f"grew beyond {_mib(max_bytes)} while read"))
    return data


def read_text(path, max_bytes: int = MAX_FILE_BYTES, encoding: str = "utf-8", errors: str = "strict", *,
              max_links: int | None = 1) -> str:
    """The text of a regular file (see :func:`open_regular`)."""
    return read_bytes(path, max_bytes, max_links=max_links).decode(encoding, errors)


# ------------------------------------------------------------------------------------------ walking
def open_folder(path, *, dir_fd: int | None = None) -> int:
    """A descriptor of the folder ``path``, refusing a link (``O_NOFOLLOW``) or anything else."""
    try:
        return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                st = os.lstat(path, dir_fd=dir_fd)
            except OSError:
                raise exc from None
            what = kind_of(st)
            raise UnsafeFileError(refusal(path, kind=what, reason=f"is a {what}, not a folder")) from None
        raise


def _entries(dfd: int) -> list:
    """``[(name, lstat result)]`` of the folder open at ``dfd``, sorted by name."""
    out = []
    for name in sorted(os.listdir(dfd)):
        try:
            out.append((name, os.stat(name, dir_fd=dfd, follow_symlinks=False)))
        except FileNotFoundError:
            continue  # removed meanwhile
    return out


def walk(top, refused: list | None = None, *, max_bytes: int | None = MAX_FILE_BYTES, max_links: int | None = 1,
         skip=()):
    """Yield ``(path, lstat result)`` for every regular file and folder under ``top`` (top excluded).

    Folders are opened relative to their parent's descriptor with ``O_NOFOLLOW``, so a folder
    swapped for a link during the walk is refused, never entered. Everything else (links, FIFOs,
    sockets, devices, hard links, files over ``max_bytes``) is appended to ``refused`` as a
    :class:`Refusal`; with ``refused=None`` the first one raises :class:`UnsafeFileError`. Names in
    ``skip`` (e.g. ``.ipynb_checkpoints``) are neither yielded nor checked. A folder is yielded
    before what it contains.
    """
    top = os.fspath(top)
    dfd = open_folder(top)
    try:
        yield from _walk_fd(dfd, top, refused, max_bytes, max_links, set(skip))
    finally:
        os.close(dfd)


def _walk_fd(dfd: int, where: str, refused, max_bytes, max_links, skip):
    for name, st in _entries(dfd):
        if name in skip:
            continue
        path = os.path.join(where, name)
        found = refusal(path, st, max_bytes=max_bytes, max_links=max_links)
        if found is not None:
            _raise_or_note(found, refused)
            continue
        yield path, st
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = open_folder(name, dir_fd=dfd)
            except UnsafeFileError as exc:  # swapped for a link since the lstat
                _raise_or_note(dataclasses.replace(exc.refusal, path=path), refused)
                continue
            try:
                yield from _walk_fd(sub, path, refused, max_bytes, max_links, skip)
            finally:
                os.close(sub)


def check_no_links(folder, *, max_bytes: int | None = MAX_FILE_BYTES, max_links: int | None = 1,
                   skip=()) -> list[Refusal]:
    """Everything under ``folder`` that :func:`walk` refuses (empty: only plain files and folders).

    ``folder`` itself being a link or not a folder is one refusal.
    """
    refused: list[Refusal] = []
    try:
        for _ in walk(folder, refused, max_bytes=max_bytes, max_links=max_links, skip=skip):
            pass
    except UnsafeFileError as exc:
        refused.append(exc.refusal)
    return refused


# ------------------------------------------------------------------------------------------ copying
def _copy_fd(src_fd: int, name: str, dst_dir_fd: int, mode: int, limit: int, shown: str) -> int:
    """Copy the open regular file ``src_fd`` to a NEW file ``name`` in ``dst_dir_fd``; bytes copied."""
    out = os.open(name, _CREATE_FLAGS, mode & 0o777 & ~0o022 | 0o600, dir_fd=dst_dir_fd)
    copied = 0
    try:
        while True:
            block = os.read(src_fd, 1 << 20)
            if not block:
                break
            copied += len(block)
            if copied > limit:
                raise UnsafeFileError(refusal(shown, kind="too large", reason="grew beyond the size accepted while "
                                                                              "it was copied"))
            view = memoryview(block)
            while view:
                view = view[os.write(out, view):]
    finally:
        os.close(out)
    return copied


def copy_file_safely(src, dst, max_bytes: int = MAX_FILE_BYTES, *, max_links: int | None = 1) -> int:
    """Copy one regular file to a path that must not exist yet (``O_EXCL | O_NOFOLLOW``); bytes copied."""
    dst = os.fspath(dst)
    with open_regular(src, max_bytes, max_links=max_links) as fh:
        st = os.fstat(fh.fileno())
        parent = open_folder(os.path.dirname(dst) or ".")
        try:
            n = _copy_fd(fh.fileno(), os.path.basename(dst), parent, st.st_mode, max_bytes, os.fspath(src))
            os.utime(os.path.basename(dst), ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=parent,
                     follow_symlinks=False)
        finally:
            os.close(parent)
    return n


def copy_tree_safely(src, dst, max_total: int = MAX_TOTAL_BYTES, *, max_file: int = MAX_FILE_BYTES,
                     ignore=None, keep_special: bool = False, refused: list | None = None) -> list[str]:
    """Copy the folder ``src`` to ``dst`` (which must not exist) without following anything.

    Regular files and folders are copied (modes without set-id bits, modification times); every
    entry of the copy is created new (``O_EXCL | O_NOFOLLOW``, ``mkdir`` relative to an
    ``O_NOFOLLOW`` folder descriptor). Anything else raises :class:`UnsafeFileError` naming the
    student and the file, unless ``refused`` is a list (then it is noted there and left out), or
    ``keep_special`` is true: then a symbolic link is made again as a link with the same text
    (never resolved) and a FIFO as a new FIFO (never opened), so that the integrity pre-flight
    reports and moves them exactly as it would the originals. ``ignore(folder, names)`` is
    :func:`shutil.copytree`'s. The total apparent size is bounded by ``max_total`` (exceeding it
    always raises). On an error the partial copy is removed. Returns the copied relative paths.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    src_fd = open_folder(src)
    try:
        os.mkdir(dst, 0o755)
        done: list[str] = []
        try:
            dst_fd = open_folder(dst)
            try:
                _copy_level(src_fd, dst_fd, src, "", ignore, keep_special, refused, [0, max_total], max_file, done)
            finally:
                os.close(dst_fd)
        except BaseException:
            import shutil

            shutil.rmtree(dst, ignore_errors=True)  # fd-based on Linux: never follows a link
            raise
        return done
    finally:
        os.close(src_fd)


def _copy_level(src_fd, dst_fd, src_top, rel, ignore, keep_special, refused, budget, max_file, done):
    entries = _entries(src_fd)
    where = os.path.join(src_top, rel) if rel else src_top
    plain = [n for n, st in entries if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)]
    # only plain entries can be ignored: a link or a FIFO is always reported, never silently dropped
    ignored = set(ignore(where, plain)) if ignore is not None else set()
    for name, st in entries:
        if name in ignored:
            continue
        path, rel_name = os.path.join(where, name), os.path.join(rel, name) if rel else name
        kind = kind_of(st)
        if keep_special and kind == "symbolic link":
            os.symlink(os.readlink(name, dir_fd=src_fd), name, dir_fd=dst_fd)
            done.append(rel_name)
            continue
        if keep_special and kind == "named pipe (FIFO)":
            os.mkfifo(name, 0o600, dir_fd=dst_fd)
            done.append(rel_name)
            continue
        found = refusal(path, st, max_bytes=max_file)
        if found is not None:
            _raise_or_note(found, refused)
            continue
        if kind == "folder":
            try:
                sub = open_folder(name, dir_fd=src_fd)
            except UnsafeFileError as exc:
                _raise_or_note(dataclasses.replace(exc.refusal, path=path), refused)
                continue
            try:
                os.mkdir(name, 0o755, dir_fd=dst_fd)
                sub_dst = open_folder(name, dir_fd=dst_fd)
                try:
                    _copy_level(sub, sub_dst, src_top, rel_name, ignore, keep_special, refused, budget, max_file, done)
                    os.fchmod(sub_dst, stat.S_IMODE(st.st_mode) & 0o755 | 0o700)
                finally:
                    os.close(sub_dst)
            finally:
                os.close(sub)
            done.append(rel_name)
            continue
        budget[0] += st.st_size
        if budget[0] > budget[1]:
            raise UnsafeFileError(refusal(path, kind="too large", reason=(
                f"takes the submission over the {_mib(budget[1])} accepted in total (a sparse file counts at "
                "the size it claims)")))
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=src_fd)
        except OSError as exc:  # swapped for a link or a socket since the lstat
            if exc.errno in (errno.ELOOP, errno.ENXIO):
                _raise_or_note(refusal(path, kind="symbolic link" if exc.errno == errno.ELOOP else "socket"), refused)
                continue
            raise
        try:
            now = refusal(path, os.fstat(fd), max_bytes=max_file)
            if now is not None:
                _raise_or_note(now, refused)
                continue
            _copy_fd(fd, name, dst_fd, st.st_mode, max_file, path)
            os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst_fd, follow_symlinks=False)
        finally:
            os.close(fd)
        done.append(rel_name)


# ---------------------------------------------------------------------------------------- moving aside
def move_aside(path, dest_dir) -> str | None:
    """Move ``path`` (a link, a FIFO, any entry, never its target) into ``dest_dir``; the new path.

    Only ``rename`` is used: the entry moves as it is. Across file systems (or mounts: a confined
    step sees each student's folder as its own mount) a link or a special file is removed instead
    (None returned); a regular file or folder is copied with :func:`copy_tree_safely` /
    :func:`copy_file_safely` (links kept as links) and then removed; one the copy refuses (over
    :data:`MAX_FILE_BYTES`, say a sparse file, or a folder over :data:`MAX_TOTAL_BYTES`) is removed
    without a copy (None). An existing entry of the same name in ``dest_dir`` is replaced.
    """
    import shutil

    path, dest_dir = os.fspath(path), os.fspath(dest_dir)
    os.makedirs(dest_dir, exist_ok=True)
    dest = os.path.join(dest_dir, os.path.basename(path))
    try:
        old = os.lstat(dest)
    except FileNotFoundError:
        old = None
    if old is not None:
        shutil.rmtree(dest) if stat.S_ISDIR(old.st_mode) else os.unlink(dest)
    try:
        os.rename(path, dest)
        return dest
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        try:
            copy_tree_safely(path, dest, keep_special=True)
        except UnsafeFileError:
            dest = None  # too big to keep a copy of: removed
        shutil.rmtree(path)
        return dest
    if stat.S_ISREG(st.st_mode):
        try:
            copy_file_safely(path, dest, max_links=None)
        except UnsafeFileError:
            dest = None
        os.unlink(path)
        return dest
    os.unlink(path)  # never copy a link or a special file as its target
    return None


def sweep(folder, dest_dir, *, max_bytes: int | None = MAX_FILE_BYTES, max_links: int | None = 1,
          skip=()) -> list[tuple[Refusal, str | None]]:
    """Move everything under ``folder`` that :func:`walk` refuses into ``dest_dir`` (same relative
    path, moved as it is, never followed: :func:`move_aside`); ``[(refusal, new path or None)]``."""
    folder, dest_dir = os.fspath(folder), os.fspath(dest_dir)
    refused: list[Refusal] = []
    for _ in walk(folder, refused, max_bytes=max_bytes, max_links=max_links, skip=skip):
        pass
    out = []
    for found in refused:
        rel = os.path.relpath(found.path, folder)
        out.append((found, move_aside(found.path, os.path.join(dest_dir, os.path.dirname(rel)))))
    return out


#: Where Linux keeps a file's POSIX ACL and a folder's default ACL (extended attributes)
ACL_ACCESS, ACL_DEFAULT = "system.posix_acl_access", "system.posix_acl_default"
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_MASK, _ACL_OTHER, _ACL_NO_ID = 0x01, 0x02, 0x04, 0x10, 0x20, 0xFFFFFFFF


def posix_acl(owner: int, users: dict, group: int = 0, other: int = 0) -> bytes:
    """A POSIX ACL in the form Linux keeps it in :data:`ACL_ACCESS` / :data:`ACL_DEFAULT` (``acl_ea.h``:
    a little-endian version 2, then 8-byte entries ``tag, perm, id`` sorted by tag and id):
    ``user::owner``, ``user:<uid>:perm`` for each ``{uid: perm}`` of ``users``, ``group::group``,
    ``mask::`` the union of the named users' and the group's permissions, ``other::other``.
    Permissions are rwx bits (``4`` read, ``2`` write, ``1`` execute/search)."""
    mask = group
    for perm in users.values():
        mask |= perm
    entries = [(_ACL_USER_OBJ, owner, _ACL_NO_ID)]
    entries += [(_ACL_USER, users[uid], uid) for uid in sorted(users)]
    entries += [(_ACL_GROUP_OBJ, group, _ACL_NO_ID), (_ACL_MASK, mask, _ACL_NO_ID), (_ACL_OTHER, other, _ACL_NO_ID)]
    return (2).to_bytes(4, "little") + b"".join(
        tag.to_bytes(2, "little") + perm.to_bytes(2, "little") + uid.to_bytes(4, "little") for tag, perm, uid in entries)


def write_bytes_replacing(path, data: bytes, mode: int = 0o644, acl: bytes | None = None) -> None:
    """Write ``data`` as the new content of ``path`` without writing through a link planted there:
    a new temporary file beside it (``O_EXCL``), then ``rename`` over the old name. With ``acl``
    (:func:`posix_acl`), the new file carries that access ACL before it gets the name (an
    ``OSError`` when the filesystem takes none: the caller decides)."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    parent = open_folder(folder or ".")
    tmp = f".{name}.{os.getpid()}.tmp"
    try:
        try:
            os.unlink(tmp, dir_fd=parent)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, _CREATE_FLAGS, mode, dir_fd=parent)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if acl is not None:
                os.setxattr(fd, ACL_ACCESS, acl)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    finally:
        os.close(parent)
