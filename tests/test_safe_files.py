"""``rlhf_lab/instructor/grader/safe_files.py``: student folders are walked, read and copied without ever
following a link, blocking on a FIFO, reading a socket or a device, taking a hard link's content or
inflating a sparse file, and every refusal names the student and the file.

Every path below sits in a course layout (``<course>/submitted/<student>/<assignment>/...``) so the
messages can be checked for the student's id. Anything that could block (a FIFO) runs in a child
process with a time limit; the module is loaded there by its file path, as ``nbgrader_config.py``
loads it.
"""
from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlhf_lab.instructor.grader import safe_files

MODULE = Path(safe_files.__file__)
SECRET = "gradebook row: everyone gets full marks"


@pytest.fixture()
def course(tmp_path):
    """``(course root, student folder, secret file outside the student folder)``."""
    root = tmp_path / "course"
    folder = root / "submitted" / "alice" / "a1"
    folder.mkdir(parents=True)
    (folder / "answer.ipynb").write_text("{}", encoding="utf-8")
    secret = root / "source" / "a1" / "solutions.txt"
    secret.parent.mkdir(parents=True)
    secret.write_text(SECRET, encoding="utf-8")
    return root, folder, secret


def _in_child(code: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run ``code`` with ``safe`` = the module loaded by its file path, in a child with a time limit."""
    prelude = ("import importlib.util, sys\n"
               f"spec = importlib.util.spec_from_file_location('safe', {str(MODULE)!r})\n"
               "safe = importlib.util.module_from_spec(spec); sys.modules['safe'] = safe\n"
               "spec.loader.exec_module(safe)\n")
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=timeout)


def _all_text_under(folder: Path) -> str:
    """Every regular file's text under ``folder`` (lstat only: links are not followed)."""
    out = []
    for dirpath, _, files in os.walk(folder):
        for name in files:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                out.append(p.read_text(errors="replace"))
    return "\n".join(out)


# --------------------------------------------------------------------------------------------- links
def test_a_link_to_a_file_is_refused_by_name_and_never_read(course):
    root, folder, secret = course
    os.symlink(secret, folder / "notes.txt")
    with pytest.raises(safe_files.UnsafeFileError) as info:
        safe_files.open_regular(folder / "notes.txt")
    message = str(info.value)
    assert "'alice'" in message and "notes.txt" in message and "symbolic link" in message
    assert SECRET not in message
    assert info.value.student == "alice" and info.value.kind == "symbolic link"
    with pytest.raises(safe_files.UnsafeFileError):
        safe_files.read_bytes(folder / "notes.txt")


def test_a_link_to_a_folder_is_reported_and_never_entered_or_copied(course, tmp_path):
    root, folder, secret = course
    os.symlink(secret.parent, folder / "src")
    refused: list = []
    seen = [Path(p).name for p, _ in safe_files.walk(folder, refused)]
    assert seen == ["answer.ipynb"]  # solutions.txt behind the link is never listed
    assert [(Path(r.path).name, r.kind, r.student) for r in refused] == [("src", "symbolic link", "alice")]
    with pytest.raises(safe_files.UnsafeFileError, match="src"):
        safe_files.copy_tree_safely(folder, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()  # the partial copy is removed
    kept: list = []
    safe_files.copy_tree_safely(folder, tmp_path / "copy2", refused=kept)
    assert sorted(os.listdir(tmp_path / "copy2")) == ["answer.ipynb"] and len(kept) == 1
    assert SECRET not in _all_text_under(tmp_path / "copy2")


def test_a_dangling_link_is_reported_not_an_error(course, tmp_path):
    root, folder, _ = course
    os.symlink(root / "nowhere", folder / "gone.txt")
    found = safe_files.check_no_links(folder)
    assert [(Path(r.path).name, r.kind) for r in found] == [("gone.txt", "symbolic link")]
    with pytest.raises(safe_files.UnsafeFileError, match="gone.txt"):
        safe_files.open_regular(folder / "gone.txt")


def test_links_and_fifos_can_be_kept_as_what_they_are(course, tmp_path):
    """``keep_special`` (collect): a link is made again with the same text, never resolved; a FIFO as a FIFO."""
    root, folder, secret = course
    os.symlink(secret, folder / "notes.txt")
    os.mkfifo(folder / "pipe")
    copy = tmp_path / "copy"
    done = safe_files.copy_tree_safely(folder, copy, keep_special=True)
    assert sorted(done) == ["answer.ipynb", "notes.txt", "pipe"]
    assert os.readlink(copy / "notes.txt") == str(secret)
    assert Path(copy / "pipe").is_fifo()


# ---------------------------------------------------------------------------------- special files
def test_a_fifo_never_blocks_reading_walking_or_copying(course, tmp_path):
    root, folder, _ = course
    os.mkfifo(folder / "answer2.ipynb")
    code = (f"folder = {str(folder)!r}\n"
            "try:\n"
            "    safe.open_regular(folder + '/answer2.ipynb')\n"
            "except safe.UnsafeFileError as exc:\n"
            "    print('REFUSED', exc)\n"
            "print('WALK', [r.kind for r in safe.check_no_links(folder)])\n"
            "try:\n"
            f"    safe.copy_tree_safely(folder, {str(tmp_path / 'copy')!r})\n"
            "except safe.UnsafeFileError as exc:\n"
            "    print('COPY', exc)\n")
    started = time.monotonic()
    done = _in_child(code)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    assert "REFUSED student 'alice'" in done.stdout and "named pipe (FIFO)" in done.stdout
    assert "WALK ['named pipe (FIFO)']" in done.stdout and "COPY student 'alice'" in done.stdout


def test_a_fifo_swapped_in_after_the_check_still_does_not_block(course):
    """``open_regular`` decides on the descriptor it opened (``O_NONBLOCK`` + ``fstat``), not on a path it
    looked at earlier: a FIFO is refused even when the path looked like a file a moment before."""
    root, folder, _ = course
    target = folder / "late.txt"
    code = (f"import os\npath = {str(target)!r}\n"
            "real_stat = os.stat\n"
            "def racing_stat(p, *a, **k):\n"
            "    st = real_stat(p, *a, **k)\n"
            "    if str(p) == path and not os.path.exists(path + '.done'):\n"
            "        os.unlink(path); os.mkfifo(path); open(path + '.done', 'w').close()\n"
            "    return st\n"
            "open(path, 'w').write('plain')\n"
            "os.stat = racing_stat\n"
            "try:\n"
            "    safe.open_regular(path)\n"
            "except safe.UnsafeFileError as exc:\n"
            "    print('REFUSED', exc.kind)\n")
    done = _in_child(code)
    assert done.returncode == 0, done.stderr
    assert "REFUSED named pipe (FIFO)" in done.stdout


def test_a_socket_is_refused():
    with tempfile.TemporaryDirectory(dir="/tmp") as base:  # a short path: sockets have a length limit
        folder = Path(base) / "submitted" / "bob" / "a1"
        folder.mkdir(parents=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(folder / "s"))
            with pytest.raises(safe_files.UnsafeFileError, match="'bob'.*socket"):
                safe_files.open_regular(folder / "s")
            assert [r.kind for r in safe_files.check_no_links(folder)] == ["socket"]
        finally:
            sock.close()


def test_a_device_is_refused_without_being_opened(course):
    root, folder, _ = course
    os.symlink("/dev/zero", folder / "zero")  # a link to a device: refused as a link
    with pytest.raises(safe_files.UnsafeFileError, match="symbolic link"):
        safe_files.open_regular(folder / "zero")
    with pytest.raises(safe_files.UnsafeFileError, match="device file"):
        safe_files.open_regular("/dev/zero", max_links=None)


# ------------------------------------------------------------------------------------ size and links
def test_a_sparse_ten_gib_file_is_refused_by_its_apparent_size_and_never_copied(course, tmp_path):
    root, folder, _ = course
    big = folder / "weights.bin"
    with open(big, "wb") as fh:
        fh.truncate(10 * 1024 ** 3)  # 10 GiB that occupy no disk blocks
    assert os.stat(big).st_blocks * 512 < 1024 ** 2
    with pytest.raises(safe_files.UnsafeFileError) as info:
        safe_files.open_regular(big)
    assert "'alice'" in str(info.value) and "weights.bin" in str(info.value) and "10240.0 MiB" in str(info.value)
    started = time.monotonic()
    with pytest.raises(safe_files.UnsafeFileError, match="weights.bin"):
        safe_files.copy_tree_safely(folder, tmp_path / "copy")
    assert time.monotonic() - started < 10 and not (tmp_path / "copy").exists()
    kept: list = []
    safe_files.copy_tree_safely(folder, tmp_path / "copy2", refused=kept)
    assert not (tmp_path / "copy2" / "weights.bin").exists() and kept[0].kind == "too large"


def test_the_total_size_of_a_copy_is_bounded(course, tmp_path):
    root, folder, _ = course
    for i in range(3):
        (folder / f"data{i}.bin").write_bytes(b"x" * 4000)
    with pytest.raises(safe_files.UnsafeFileError, match="in total"):
        safe_files.copy_tree_safely(folder, tmp_path / "copy", max_total=10000)
    assert not (tmp_path / "copy").exists()


def test_a_hard_link_to_a_file_outside_is_refused_and_says_why(course, tmp_path):
    root, folder, secret = course
    os.link(secret, folder / "copy_of_solutions.txt")  # a regular file with st_nlink == 2
    with pytest.raises(safe_files.UnsafeFileError) as info:
        safe_files.read_text(folder / "copy_of_solutions.txt")
    assert "hard link" in str(info.value) and "2 names" in str(info.value) and "'alice'" in str(info.value)
    kept: list = []
    safe_files.copy_tree_safely(folder, tmp_path / "copy", refused=kept)
    assert [r.kind for r in kept] == ["hard link"]
    assert SECRET not in _all_text_under(tmp_path / "copy")


# ------------------------------------------------------------------------- swapped between check and use
def test_a_folder_swapped_for_a_link_during_the_walk_is_never_entered(course):
    root, folder, secret = course
    sub = folder / "data"
    sub.mkdir()
    (sub / "mine.txt").write_text("mine")
    refused: list = []
    seen = []
    for path, st in safe_files.walk(folder, refused):
        seen.append(os.path.relpath(path, folder))
        if path.endswith("data"):  # the walk looked at it: now swap it for a link to source/
            os.rename(sub, folder / "data.old")
            os.symlink(secret.parent, sub)
    assert "data/solutions.txt" not in seen and "data/mine.txt" not in seen
    assert [(os.path.relpath(r.path, folder), r.kind) for r in refused] == [("data", "symbolic link")]


def test_entries_swapped_for_links_during_a_copy_are_never_followed(course, tmp_path):
    """``copy_tree_safely`` lists and ``lstat``s a folder, then opens each entry with ``O_NOFOLLOW``
    (folders too): a file and a folder replaced by links in between (here from the ``ignore``
    callback, which runs between the two) are refused, not copied as their targets."""
    root, folder, secret = course
    (folder / "notes.txt").write_text("my notes")
    (folder / "data").mkdir()
    swapped = []

    def swap(where, names):
        if not swapped:
            os.unlink(folder / "notes.txt")
            os.symlink(secret, folder / "notes.txt")
            os.rename(folder / "data", folder / "data.old")
            os.symlink(secret.parent, folder / "data")
            swapped.append(True)
        return []

    kept: list = []
    safe_files.copy_tree_safely(folder, tmp_path / "copy", ignore=swap, refused=kept)
    assert sorted(Path(r.path).name for r in kept) == ["data", "notes.txt"]
    assert SECRET not in _all_text_under(tmp_path / "copy")
    assert not (tmp_path / "copy" / "data" / "solutions.txt").exists()


def test_a_link_planted_at_the_destination_is_never_written_through(course, tmp_path):
    root, folder, secret = course
    dest = tmp_path / "out"
    dest.mkdir()
    os.symlink(secret, dest / "answer.ipynb")
    with pytest.raises(FileExistsError):
        safe_files.copy_file_safely(folder / "answer.ipynb", dest / "answer.ipynb")
    safe_files.write_bytes_replacing(dest / "answer.ipynb", b"new")
    assert secret.read_text() == SECRET  # the target is untouched
    assert not (dest / "answer.ipynb").is_symlink() and (dest / "answer.ipynb").read_bytes() == b"new"


def test_move_aside_moves_the_link_itself(course, tmp_path):
    root, folder, secret = course
    os.symlink(secret, folder / "notes.txt")
    os.mkfifo(folder / "pipe")
    moved = safe_files.sweep(folder, tmp_path / "quarantine")
    assert sorted(Path(r.path).name for r, _ in moved) == ["notes.txt", "pipe"]
    assert os.readlink(tmp_path / "quarantine" / "notes.txt") == str(secret)
    assert (tmp_path / "quarantine" / "pipe").is_fifo() and secret.read_text() == SECRET
    assert sorted(os.listdir(folder)) == ["answer.ipynb"]


def test_move_aside_across_mounts_copies_what_is_bounded_and_removes_the_rest(course, tmp_path, monkeypatch):
    """A confined step sees a student's folder as its own mount: ``rename`` into ``integrity/`` gives
    EXDEV there. A small file is copied then removed; a link is removed, never copied as its
    target; a sparse file over the bound is removed, never inflated."""
    root, folder, secret = course
    (folder / "notes.txt").write_text("mine")
    os.symlink(secret, folder / "link.txt")
    with open(folder / "weights.bin", "wb") as fh:
        fh.truncate(safe_files.MAX_FILE_BYTES + 1)
    (folder / "big").mkdir()
    with open(folder / "big" / "w.bin", "wb") as fh:
        fh.truncate(safe_files.MAX_FILE_BYTES + 1)

    def no_rename(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    monkeypatch.setattr(safe_files.os, "rename", no_rename)
    dest = tmp_path / "quarantine"
    assert safe_files.move_aside(folder / "notes.txt", dest) == str(dest / "notes.txt")
    assert (dest / "notes.txt").read_text() == "mine"
    for name in ("link.txt", "weights.bin", "big"):
        assert safe_files.move_aside(folder / name, dest) is None, name
        assert not os.path.lexists(dest / name), name
    assert sorted(os.listdir(folder)) == ["answer.ipynb"] and secret.read_text() == SECRET


@pytest.mark.parametrize("path, student", [
    ("/c/submitted/alice/a1/x.ipynb", "alice"),
    ("/c/autograded/bob/a1/sub/y.txt", "bob"),
    ("/c/feedback/carol/a1/z.html", "carol"),
    ("/c/submitted/dave/a1/feedback/notes/x", "dave"),  # a student's own folder named feedback
    ("/x/exchange/rlhf-ppo/inbound/erin+a1+2024-01-01 00:00:00.000000 UTC+abc/n.ipynb", "erin"),
    ("/tmp/elsewhere/file", None),
])
def test_the_student_is_read_from_the_path(path, student):
    assert safe_files.student_of(path) == student


def test_only_plain_files_and_folders_are_yielded(course):
    root, folder, secret = course
    (folder / "sub").mkdir()
    (folder / "sub" / "ok.txt").write_text("ok")
    os.symlink(secret, folder / "sub" / "bad")
    refused: list = []
    got = sorted(os.path.relpath(p, folder) for p, _ in safe_files.walk(folder, refused))
    assert got == ["answer.ipynb", "sub", "sub/ok.txt"]
    assert [os.path.relpath(r.path, folder) for r in refused] == ["sub/bad"]
    with pytest.raises(safe_files.UnsafeFileError, match="sub/bad"):
        list(safe_files.walk(folder))  # without a list, the first refusal raises


def test_the_submission_fingerprint_never_follows_or_blocks(tmp_path):
    """records.submission_fingerprint over a folder with a FIFO and a link to a secret: it returns
    (no hang), does not depend on the secret's bytes, and still changes with the student's files."""
    from rlhf_lab.instructor.classrun import records
    from rlhf_lab.instructor.course import Course

    course = Course(root=str(tmp_path), course_id="c", db_url="sqlite://", submitted_directory="submitted",
                    autograded_directory="autograded", source_directory="source",
                    directory_structure="{nbgrader_step}/{student_id}/{assignment_id}")
    folder = tmp_path / "submitted" / "alice" / "a1"
    folder.mkdir(parents=True)
    (folder / "nb.ipynb").write_text("{}")
    secret = tmp_path / "secret.txt"
    secret.write_text("one")
    os.mkfifo(folder / "pipe")
    os.symlink(secret, folder / "link.txt")
    first = records.submission_fingerprint(course, "a1", "alice")
    secret.write_text("two")
    assert records.submission_fingerprint(course, "a1", "alice") == first
    (folder / "nb.ipynb").write_text('{"changed": 1}')
    assert records.submission_fingerprint(course, "a1", "alice") != first
