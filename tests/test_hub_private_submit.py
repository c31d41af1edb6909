"""The hub's submissions and feedback are private to their student (and the instructor) (issue 21).

Fast, no hub and no accounts: nbgrader's real ``submit`` runs with the students' config snippet
(:data:`hub.PRIVATE_SUBMIT`) into an exchange laid out as the hub lays it out, and the result is
compared with what nbgrader's own submit leaves (everything readable by every account); the
course's ``release_feedback`` with ``private_to_student`` (the hub's instructor config) leaves each
page to its student's account. The ACLs are read back in the kernel's own format.
"""
from __future__ import annotations

import os
import stat
import subprocess
import struct
import sys
from pathlib import Path

import nbformat

from rlhf_lab.instructor.operations import hub

BIN = Path(sys.executable).parent


def _submit(tmp_path: Path, private: bool, acl: bool = True) -> Path:
    """Release a one-notebook assignment into a fresh exchange, submit it, return the submission."""
    exchange = tmp_path / "exchange"
    outbound = exchange / "c1" / "outbound" / "a1"
    outbound.mkdir(parents=True)
    inbound = exchange / "c1" / "inbound"
    inbound.mkdir()
    os.chmod(exchange, 0o1777)
    os.chmod(inbound, 0o3733)  # as hub.exchange_layout has it: write-only, setgid, sticky
    if acl:  # and as hub users sets it: what is made in it inherits the instructor's entry (here: us)
        os.setxattr(inbound, hub.DEFAULT_ACL, hub.inbound_default_acl(os.getuid()))
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), outbound / "task.ipynb")
    work = tmp_path / "home"
    (work / "a1").mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 2")]), work / "a1" / "task.ipynb")
    config = tmp_path / "config"
    config.mkdir()
    (config / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.course_id = 'c1'\nc.Exchange.root = {str(exchange)!r}\n"
        "c.Exchange.path_includes_course = False\n" + (hub.PRIVATE_SUBMIT if private else ""))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_DATA_DIR=str(tmp_path / "data"),
               HOME=str(work))
    env.pop("JUPYTER_CONFIG_PATH", None)
    old = os.umask(0o022)  # a student's usual umask: nbgrader's copy would leave files 0644
    try:
        done = subprocess.run([str(BIN / "nbgrader"), "submit", "a1"], cwd=work, env=env,
                              capture_output=True, text=True, timeout=120)
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr[-2000:]
    (entry,) = inbound.iterdir()
    return entry


def _modes(entry: Path) -> dict:
    return {p.relative_to(entry.parent).as_posix(): stat.S_IMODE(p.lstat().st_mode)
            for p in [entry, *entry.rglob("*")]}


def test_nbgraders_own_submit_leaves_a_submission_readable_by_every_account(tmp_path):
    """The reason for the snippet: without it, files are 0644 and the folder 0777."""
    modes = _modes(_submit(tmp_path, private=False))
    assert any(mode & 0o004 for mode in modes.values()), modes


def _acl_entries(path: Path, name: str) -> list[tuple[int, int, int]]:
    raw = os.getxattr(path, name)
    assert struct.unpack("<I", raw[:4]) == (2,)
    return [struct.unpack("<HHI", raw[i:i + 8]) for i in range(4, len(raw), 8)]


def test_the_hubs_submit_leaves_nothing_for_other_accounts(tmp_path):
    entry = _submit(tmp_path, private=True)
    modes = _modes(entry)
    assert {name: oct(mode) for name, mode in modes.items() if mode & 0o007} == {}
    assert modes[entry.name] == 0o770  # the instructor may still remove it after collect
    assert nbformat.read(entry / "task.ipynb", as_version=4).cells[0].source == "x = 2"
    assert (entry / "timestamp.txt").is_file()
    # every file's access ACL: the instructor's entry (here our own uid) reads, the owning group nothing
    for path in [entry, *entry.rglob("*")]:
        entries = {tag: (perm, uid) for tag, perm, uid in _acl_entries(path, "system.posix_acl_access")}
        assert entries[0x02] == (7, os.getuid()), path  # user:<instructor>:rwx ...
        assert entries[0x04][0] == 0, path  # group::---
        assert entries[0x10][0] & 0o4, path  # ... under a mask that lets it read
        assert entries[0x20][0] == 0, path  # other::---


def test_without_acls_the_submit_is_nbgraders_own_so_the_instructor_can_still_collect(tmp_path):
    """A filesystem without ACLs (``hub users`` says so): restricting the bits would lock out the instructor."""
    def by_file(entry):  # the folder's own name has the time and a random part in it
        return {name.split("/", 1)[1] if "/" in name else ".": mode for name, mode in _modes(entry).items()}

    ours, nbgraders = by_file(_submit(tmp_path, private=True, acl=False)), by_file(_submit(tmp_path / "b", private=False))
    assert ours == nbgraders and ours["."] == 0o777 and ours["task.ipynb"] == 0o644


def test_the_default_acl_is_the_kernels_format_of_the_entries_named():
    raw = hub.inbound_default_acl(1234)
    assert raw == bytes.fromhex("02000000" "01000700ffffffff" "02000700d2040000" "04000000ffffffff"
                                "10000700ffffffff" "20000000ffffffff")


def _release_feedback(tmp_path: Path, private: bool) -> Path:
    """nbgrader's real ``release_feedback`` with the course's release class, one page of a student
    whose id is this test's own account (so that it has a Linux account); the released page."""
    import getpass

    student = getpass.getuser()
    root = tmp_path / "course"
    page_dir = root / "feedback" / student / "a1"
    page_dir.mkdir(parents=True)
    (page_dir / "task.html").write_text("<p>your feedback</p>")
    (page_dir / "timestamp.txt").write_text("2026-12-01 10:00:00.000000 UTC")
    (page_dir / "submission_secret.txt").write_text("s" * 128)
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    os.chmod(exchange, 0o1777)
    hook = Path(hub.__file__).resolve().parents[1] / "grader" / "preflight_hook.py"
    (root / "nbgrader_config.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('course_hook', {str(hook)!r})\n"
        "hook = importlib.util.module_from_spec(spec); spec.loader.exec_module(hook)\n"
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.root = {str(root)!r}\nc.CourseDirectory.course_id = 'c1'\n"
        f"c.Exchange.root = {str(exchange)!r}\n"
        "c.ExchangeFactory.release_feedback = hook.safe_release_feedback_class()\n"
        f"c.SafeExchangeReleaseFeedback.private_to_student = {private!r}\n")
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    env.pop("JUPYTER_CONFIG_PATH", None)
    done = subprocess.run([str(BIN / "nbgrader"), "release_feedback", "a1"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    (page,) = (exchange / "c1" / "feedback").glob("*.html")
    assert page.read_text() == "<p>your feedback</p>"
    return page


def test_released_feedback_is_its_students_alone_with_private_to_student(tmp_path):
    page = _release_feedback(tmp_path, private=True)
    assert not _mode(page) & 0o007, oct(_mode(page))
    entries = {tag: (perm, uid) for tag, perm, uid in _acl_entries(page, "system.posix_acl_access")}
    assert entries[0x02] == (4, os.getuid())  # user:<the student's account>:r--
    assert entries[0x04][0] == 0 and entries[0x20][0] == 0  # nothing for the group or other accounts


def test_without_private_to_student_feedback_is_released_as_nbgrader_does(tmp_path):
    page = _release_feedback(tmp_path, private=False)
    assert _mode(page) == 0o644
    try:
        os.getxattr(page, "system.posix_acl_access")
        raise AssertionError("an ACL on a page released the usual way")
    except OSError:
        pass


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_acl_format_names_each_user_once_and_masks_their_union():
    from rlhf_lab.instructor.grader import safe_files

    raw = safe_files.posix_acl(6, {20: 4, 10: 1}, group=2, other=0)
    entries = [struct.unpack("<HHI", raw[i:i + 8]) for i in range(4, len(raw), 8)]
    none = 0xFFFFFFFF
    assert entries == [(0x01, 6, none), (0x02, 1, 10), (0x02, 4, 20), (0x04, 2, none), (0x10, 7, none), (0x20, 0, none)]
