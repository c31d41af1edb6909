"""What a sandboxed kernel leaves behind is never trusted (rlhf_lab/instructor/grader/sandbox.py).

The kernel works in a scratch copy of its notebook folder, bound at the folder's path inside the
sandbox; the real ``autograded/<student>/<assignment>/`` is never mounted or handed to the kernel's
user id, so the links, FIFOs and sparse files a kernel makes there cannot redirect what nbgrader
(root, outside the sandbox) writes or reads afterwards. Its private ``/tmp`` is a bounded tmpfs
whose size comes out of its address-space limit, and it inherits none of the grader's file
descriptors. Every test starts real bubblewrap kernels; the slow one runs a real ``nbgrader
autograde`` (and ``generate_feedback``) of a student who tries the link attack.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import nbformat
import pytest
from traitlets.config import Config

from course_support import REPO, load_module

sandbox = load_module(REPO / "helpers/rlhf_lab/instructor/grader/sandbox.py", "rlhf_lab_course_sandbox")
kernel_guard = sandbox._kernel_guard

needs_bwrap = pytest.mark.skipif(sandbox.find_bwrap() is None, reason="bubblewrap (bwrap) is not installed")
pytestmark = needs_bwrap

ASSIGNMENT = "a2_ppo_rlhf"
NOTEBOOK = "01_losses"
MIB = 1024 * 1024


def _snapshot(folder: Path) -> dict:
    """Every entry under ``folder`` (links not followed): its kind, owner, mode and bytes; not the
    grader's library builds (``.cache/``), which it makes when the first kernel starts."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.relative_to(folder).parts[0] == ".cache":
            continue
        st = os.lstat(path)
        kind = stat.S_IFMT(st.st_mode)
        data = path.read_bytes() if stat.S_ISREG(st.st_mode) else os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
        out[str(path.relative_to(folder))] = (kind, st.st_uid, stat.S_IMODE(st.st_mode), data)
    return out


@pytest.fixture
def course(tmp_path):
    """A course with alice's notebook folder (her notebook and a data file), bob's graded notebook,
    a hidden source file and a gradebook; and an empty folder for the kernels' scratch folders."""
    root = tmp_path / "course"
    (root / "source" / ASSIGNMENT).mkdir(parents=True)
    (root / "source" / ASSIGNMENT / "hidden.txt").write_text("HIDDEN\n")
    (root / "gradebook.db").write_bytes(b"GRADEBOOK")
    bob = root / "autograded" / "bob" / ASSIGNMENT
    bob.mkdir(parents=True)
    (bob / f"{NOTEBOOK}.ipynb").write_text('{"bob": "graded"}')
    mine = root / "autograded" / "alice" / ASSIGNMENT
    (mine / "data").mkdir(parents=True)
    (mine / f"{NOTEBOOK}.ipynb").write_text('{"alice": "submitted"}')
    (mine / "data" / "table.csv").write_text("a,b\n1,2\n")
    (tmp_path / "scratch").mkdir()
    return root


def run_cells(course: Path, cells: list[str], *, timeout: int = 60, **manager) -> tuple[list, object]:
    """Run ``cells`` in alice's folder as autograde does; (outputs per cell, the kernel manager)."""
    started = []

    class Recording(sandbox.SandboxedKernelManager):
        """The sandbox's manager, kept here: nbclient drops its own reference when the run ends."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    c = Config()
    c.Execute.kernel_manager_class = Recording
    c.Execute.timeout = timeout
    c.Execute.interrupt_on_timeout = True
    c.Execute.kill_grace = 3
    c.Execute.startup_timeout = 120
    c.SandboxedKernelManager.course_root = str(course)
    c.SandboxedKernelManager.compile_cache_root = ""
    c.SandboxedKernelManager.scratch_dir = str(course.parent / "scratch")
    for key, value in manager.items():
        setattr(c.SandboxedKernelManager, key, value)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    ex = kernel_guard.Execute(config=c)
    folder = course / "autograded" / "alice" / ASSIGNMENT
    nb, _ = ex.preprocess(nb, {"metadata": {"path": str(folder)}, "unique_key": NOTEBOOK})
    return [list(cell.outputs) for cell in nb.cells], (started[-1] if started else None)


def stdout(outputs: list) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


def attack(course: Path) -> str:
    """Cell code: replace the notebook by links out of the folder, add a FIFO, a 10 GiB sparse file
    and a link to /etc, and report what the kernel saw."""
    outside = course.parent / "outside.txt"
    classmate = course / "autograded" / "bob" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    return textwrap.dedent(f"""\
        import json, os
        seen = {{"cwd": os.getcwd(), "files": sorted(os.listdir(".")),
                 "notebook": open("{NOTEBOOK}.ipynb").read(), "data": open("data/table.csv").read()}}
        os.remove("{NOTEBOOK}.ipynb")
        os.symlink({str(classmate)!r}, "{NOTEBOOK}.ipynb")
        os.symlink({str(outside)!r}, "other.ipynb")
        os.symlink("/etc", "etc")
        os.symlink({str(course / "gradebook.db")!r}, "data/table.csv.link")
        os.mkfifo("pipe")
        with open("sparse.bin", "wb") as f:
            f.truncate(10 * 1024 ** 3)
        os.chmod("data", 0)
        seen["made"] = sorted(os.listdir("."))
        print(json.dumps(seen))
        """)


def test_what_the_kernel_leaves_in_its_folder_never_reaches_the_real_folder(course, caplog):
    """links to a classmate's notebook and to a file outside, a FIFO, a sparse file, a link to /etc:
    all made in the scratch; the real folder, the targets and the scratch parent end unchanged/empty"""
    outside = course.parent / "outside.txt"
    outside.write_text("OUTSIDE\n")
    mine = course / "autograded" / "alice" / ASSIGNMENT
    before_mine, before_course = _snapshot(mine), _snapshot(course)
    # no file-size limit: the 10 GiB sparse file is really made
    outs, _ = run_cells(course, [attack(course)], file_mb=0)
    seen = json.loads(stdout(outs[0]).strip().splitlines()[-1])
    # the kernel worked where it always did, on copies of its files
    assert seen["cwd"] == str(mine)
    assert seen["files"] == ["01_losses.ipynb", "data"]
    assert seen["notebook"] == '{"alice": "submitted"}' and seen["data"] == "a,b\n1,2\n"
    assert {"etc", "pipe", "sparse.bin", "other.ipynb"} <= set(seen["made"])
    # ... and none of it is in the real folder, nor did anything outside change
    assert _snapshot(mine) == before_mine
    assert _snapshot(course) == before_course
    assert outside.read_text() == "OUTSIDE\n"
    # the scratch is gone (deleted without following the links: /etc is intact)
    assert list((course.parent / "scratch").iterdir()) == []
    assert os.path.isfile("/etc/passwd")
    # nbgrader's next steps on the real folder: writing the notebook, the permissions walk and a
    # copy of the folder (what feedback does) finish at once and touch only the folder
    (mine / f"{NOTEBOOK}.ipynb").write_text('{"alice": "graded"}')
    for folder, _, files in os.walk(mine):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    shutil.copytree(mine, course.parent / "feedback-copy")
    assert (course / "autograded" / "bob" / ASSIGNMENT / f"{NOTEBOOK}.ipynb").read_text() == '{"bob": "graded"}'
    assert outside.read_text() == "OUTSIDE\n"


def test_only_regular_files_and_folders_are_copied_into_the_scratch(course, caplog):
    """a link, a FIFO or a file over the copy limit in the real folder is skipped, with a log line
    that names the student and the file"""
    mine = course / "autograded" / "alice" / ASSIGNMENT
    (course.parent / "secret.txt").write_text("SECRET\n")
    os.symlink(course.parent / "secret.txt", mine / "link.txt")
    os.mkfifo(mine / "pipe")
    (mine / "big.bin").write_bytes(b"x" * (2 * MIB))
    with caplog.at_level("WARNING"):
        outs, _ = run_cells(course, ["import os\nprint(sorted(os.listdir('.')))"], scratch_copy_mb=1)
    assert stdout(outs[0]).strip() == "['01_losses.ipynb', 'data']"
    messages = [r.getMessage() for r in caplog.records]
    for name in ("link.txt", "pipe", "big.bin"):
        assert any("student alice" in m and f" {name} " in m for m in messages), (name, messages)
    assert any("link.txt is a symbolic link" in m for m in messages), messages
    assert any("pipe is a FIFO" in m for m in messages), messages


def test_filling_tmp_beyond_its_cap_fails_the_cell_not_the_grader(course):
    """the private /tmp holds at most tmp_mb; the kernel's address-space limit is lower by as much"""
    outs, _ = run_cells(course, [
        "import errno, os, resource\n"
        "st = os.statvfs('/tmp')\n"
        "print('TMP', st.f_blocks * st.f_frsize // 2**20, resource.getrlimit(resource.RLIMIT_AS)[0] // 2**20)\n"
        "try:\n"
        "    with open('/tmp/fill', 'wb') as f:\n"
        "        for _ in range(200):\n"
        "            f.write(b'x' * 2**20)\n"
        "            f.flush()\n"
        "    print('FILLED')\n"
        "except OSError as exc:\n"
        "    print('FULL', errno.errorcode[exc.errno])\n",
        "print('kernel still answers')",
    ], memory_mb=2048, tmp_mb=64)
    lines = dict(line.split(" ", 1) for line in stdout(outs[0]).strip().splitlines())
    assert lines["TMP"].split() == ["64", str(2048 - 64)]
    assert lines.get("FULL") == "ENOSPC", outs[0]
    assert stdout(outs[1]).strip() == "kernel still answers"


def test_default_tmp_is_an_eighth_of_the_memory_at_most_512_mib(course):
    """memory 4096 MiB: /tmp 512 MiB and RLIMIT_AS 3584 MiB (together the 4 GiB the kernel may hold)"""
    outs, _ = run_cells(course, [
        "import os, resource\nst = os.statvfs('/tmp')\n"
        "print(st.f_blocks * st.f_frsize // 2**20, resource.getrlimit(resource.RLIMIT_AS)[0] // 2**20)"],
        memory_mb=4096, tmp_mb=0)
    assert stdout(outs[0]).split() == ["512", "3584"]


FD_WRITER = r'''
import os, sys
# ipykernel forwards fds 1 and 2 into the cell; the descriptors it started with are kept aside
originals = [getattr(s, "_original_stdstream_copy", None) for s in (sys.stdout, sys.stderr)]
for fd in [*range(1, 21), *filter(None, originals)]:
    try:
        os.write(fd, b"\nFD-MARKER-%d\n" % fd)
    except OSError:
        pass
for fd in filter(None, originals):
    os.write(fd, b"y" * (1024 * 1024))
print("ORIGINALS", *originals)
'''


def test_the_kernel_writes_into_no_descriptor_of_the_grader(course, capfd):
    """fds 1, 2, 3..20 and the descriptors ipykernel started with lead nowhere near the grader's
    stdout/stderr; stdin is /dev/null; what reached the kernel's own stdout/stderr is kept, bounded"""
    capfd.readouterr()
    outs, km = run_cells(course, ["import os\nprint(os.readlink('/proc/self/fd/0'))", FD_WRITER])
    captured = capfd.readouterr()
    assert "FD-MARKER" not in captured.out and "FD-MARKER" not in captured.err
    assert "yyyy" not in captured.out + captured.err
    assert stdout(outs[0]).strip() == "/dev/null"
    originals = [line for line in stdout(outs[1]).splitlines() if line.startswith("ORIGINALS")]
    assert originals and len(originals[0].split()) == 3, outs[1]  # this ipykernel keeps both aside
    kept = km.kernel_output
    assert b"FD-MARKER-" in kept
    assert len(kept) == 64 * 1024  # the first 64 KiB; the rest was read and dropped


def _descendants(pid: int) -> list[int]:
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def test_bwrap_and_the_kernel_hold_no_open_file_of_the_grader(course, tmp_path):
    """seen from the host: no descriptor of bwrap or of any process in the sandbox is one of the
    grader's open files (its stdout, stderr, log files, the gradebook), except the output pipe"""
    grader_file = open(tmp_path / "grader.log", "w")  # an open file of the grader's, not close-on-exec
    os.set_inheritable(grader_file.fileno(), True)
    km = sandbox.SandboxedKernelManager(kernel_name="python3", course_root=str(course), compile_cache_root="",
                                        scratch_dir=str(tmp_path / "scratch"), notebook_name=NOTEBOOK)

    async def check() -> list:
        await km.start_kernel(cwd=str(course / "autograded" / "alice" / ASSIGNMENT))
        try:
            kc = km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=120)
            kc.stop_channels()
            mine = {}
            for fd in os.listdir("/proc/self/fd"):
                try:
                    st = os.stat(f"/proc/self/fd/{fd}")
                except OSError:
                    continue
                mine[(st.st_dev, st.st_ino)] = int(fd)
            pipe = os.fstat(km._output._fd)
            shared = []
            for pid in _descendants(km.provisioner.process.pid):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        st = os.stat(f"/proc/{pid}/fd/{fd}")
                    except OSError:
                        continue
                    key = (st.st_dev, st.st_ino)
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("anon_inode:"):
                        continue  # eventfd/epoll/signalfd: one shared inode for all, nothing of ours
                    if key in mine and key != (pipe.st_dev, pipe.st_ino) and not stat.S_ISCHR(st.st_mode):
                        shared.append((pid, fd, target))
            return shared
        finally:
            await km.shutdown_kernel(now=True)
            km.release_sandbox()

    try:
        assert asyncio.run(check()) == []
    finally:
        grader_file.close()


UNPRIVILEGED_RUNNER = r'''
import importlib.util, json, sys
from traitlets.config import Config
import nbformat
spec = importlib.util.spec_from_file_location("rlhf_lab_course_sandbox", sys.argv[1])
sandbox = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = sandbox
spec.loader.exec_module(sandbox)
args = json.loads(sys.argv[2])
c = Config()
c.Execute.kernel_manager_class = sandbox.SandboxedKernelManager
c.Execute.startup_timeout = 120
c.SandboxedKernelManager.course_root = args["course"]
c.SandboxedKernelManager.compile_cache_root = ""
c.SandboxedKernelManager.scratch_dir = args["scratch"]
c.SandboxedKernelManager.file_mb = 0
nb = nbformat.v4.new_notebook()
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nb.cells = [nbformat.v4.new_code_cell(args["cell"])]
nb, _ = sandbox._kernel_guard.Execute(config=c).preprocess(
    nb, {"metadata": {"path": args["folder"]}, "unique_key": "01_losses"})
print("RESULT " + json.dumps([o.get("text", "") for o in nb.cells[0].outputs]))
'''


def _reachable_interpreter(cmd: list[str], base: Path) -> list[str]:
    """``cmd`` run so an ordinary user can execute this Python: when the base interpreter lives in
    a folder of /root (mode 0700 here), in a private mount namespace where /root is a traversable
    tmpfs holding only a bind mount of that folder (nothing on the host changes)."""
    real = Path(os.path.realpath(sys.base_prefix))
    if real.parts[:2] != ("/", "root") or os.stat("/root").st_mode & 0o001:
        return cmd
    top = Path("/root", real.parts[2])
    hold = base / "interpreter"
    hold.mkdir()
    script = (f"mount --bind {top} {hold} && mount -t tmpfs -o mode=0755,size=1m tmpfs /root && "
              f"mkdir {top} && mount --bind {hold} {top} && exec \"$@\"")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *cmd]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("unshare") is None,
                    reason="needs root and setpriv to switch to an unprivileged grader")
def _closed_ancestor(path: str) -> str | None:
    """The first folder above ``path`` that other users cannot traverse (outside ``/root``, which
    :func:`_reachable_interpreter` handles), or None."""
    parts = Path(os.path.abspath(path)).parts
    for i in range(2, len(parts)):
        folder = Path(*parts[:i])
        if folder.parts[:2] == ("/", "root"):
            continue
        if not os.stat(folder).st_mode & 0o001:
            return str(folder)
    return None


def test_an_unprivileged_grader_gets_the_same_scratch(tmp_path):
    """the same attack, with the grader an ordinary user (bubblewrap in a user namespace)"""
    closed = _closed_ancestor(sys.prefix) or _closed_ancestor(str(REPO))
    if closed:
        pytest.skip(f"{closed} (above this checkout or its .venv) is closed to other users, so an unprivileged "
                    "grader cannot run this Python")
    uid = 1_234_567
    base = Path(tempfile.mkdtemp(prefix="rlhf-unpriv-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        course = base / "course"
        mine = course / "autograded" / "alice" / ASSIGNMENT
        bob = course / "autograded" / "bob" / ASSIGNMENT
        for folder in (mine / "data", bob, course / "source" / ASSIGNMENT, base / "scratch", base / "home"):
            folder.mkdir(parents=True)
        (mine / f"{NOTEBOOK}.ipynb").write_text('{"alice": "submitted"}')
        (mine / "data" / "table.csv").write_text("a,b\n1,2\n")
        (bob / f"{NOTEBOOK}.ipynb").write_text('{"bob": "graded"}')
        (course / "gradebook.db").write_bytes(b"GRADEBOOK")
        (base / "outside.txt").write_text("OUTSIDE\n")
        for folder, dirs, files in os.walk(base):
            for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                os.chown(name, uid, uid, follow_symlinks=False)
        before_mine, before_course = _snapshot(mine), _snapshot(course)
        args = {"course": str(course), "scratch": str(base / "scratch"), "folder": str(mine), "cell": attack(course)}
        env = {k: v for k, v in os.environ.items() if k not in ("RLHF_COURSE_DB", sandbox.NO_SANDBOX_ENV)}
        env.update(HOME=str(base / "home"), TMPDIR=str(base), JAX_PLATFORMS="cpu")
        grader = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable,
                  "-c", UNPRIVILEGED_RUNNER, str(REPO / "helpers/rlhf_lab/instructor/grader/sandbox.py"), json.dumps(args)]
        proc = subprocess.run(_reachable_interpreter(grader, base), capture_output=True, text=True, env=env,
                              timeout=300, cwd=str(base))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
        seen = json.loads("".join(result).strip().splitlines()[-1])
        assert seen["notebook"] == '{"alice": "submitted"}'
        assert {"etc", "pipe", "sparse.bin", "other.ipynb"} <= set(seen["made"])
        assert _snapshot(mine) == before_mine and _snapshot(course) == before_course
        assert (base / "outside.txt").read_text() == "OUTSIDE\n"
        assert list((base / "scratch").iterdir()) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_scratch_left_by_a_killed_grader_is_swept_a_live_one_is_not(tmp_path):
    """the next kernel start removes scratch folders whose lock is free; a live kernel's stays"""
    live = sandbox.Scratch(str(tmp_path))
    dead = sandbox.Scratch(str(tmp_path))
    os.symlink("/etc", os.path.join(dead.work, "etc"))
    os.close(dead._lock)  # what the grader's death does to its lock
    dead._lock = None
    old = os.path.getmtime(live.root) - 2 * sandbox.SCRATCH_SWEEP_AGE
    for path in (live.root, dead.root):
        os.utime(path, (old, old))
    assert sandbox.sweep_stale_scratches(str(tmp_path)) == 1
    assert os.path.isdir(live.work) and not os.path.lexists(dead.root)
    assert os.path.isfile("/etc/passwd")
    assert live.remove() and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ slow: a real nbgrader autograde
TOY = "toy"


def _nbgrader_env(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RLHF_COURSE_DB", "MPLBACKEND", sandbox.NO_SANDBOX_ENV)}
    env.update(RLHF_COURSE_ROOT=str(root), JAX_PLATFORMS="cpu",
               PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""))
    return env


@pytest.mark.slow
def test_nbgrader_autograde_of_a_link_attack_leaves_the_classmate_untouched(tmp_path):
    """real nbgrader: mallory's answer cell replaces her notebook by a link to bob's autograded
    notebook (and leaves a FIFO, a sparse file and links); bob's notebook stays byte-identical,
    source/ and the gradebook are not written through, and feedback generation finishes"""
    root = tmp_path / "toy_course"
    (root / "source" / TOY).mkdir(parents=True)
    (root / "nbgrader_config.py").write_text((REPO / "nbgrader_config.py").read_text())
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}

    def cell(source, **md):
        c = nbformat.v4.new_code_cell(source)
        c.metadata["nbgrader"] = {"schema_version": 3, "task": False, **md}
        return c

    nb.cells = [
        cell("def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION",
             grade=False, solution=True, locked=False, grade_id="answer_add"),
        cell("assert add(1, 2) == 3", grade=True, solution=False, locked=True, grade_id="test_add", points=2),
    ]
    nbformat.write(nb, root / "source" / TOY / "toy.ipynb")
    env = _nbgrader_env(root)
    nbg = [sys.executable, "-m", "nbgrader"]

    def nbgrader(*args, timeout=600):
        proc = subprocess.run(nbg + list(args), cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    nbgrader("generate_assignment", TOY, "--force")
    released = nbformat.read(root / "release" / TOY / "toy.ipynb", as_version=4)
    bob_nb = root / "autograded" / "bob" / TOY / "toy.ipynb"
    attack_cell = textwrap.dedent(f"""\
        import os
        os.remove("toy.ipynb")
        os.symlink({str(bob_nb)!r}, "toy.ipynb")
        os.symlink({str(root / "source" / TOY / "toy.ipynb")!r}, "toy_files")
        os.symlink({str(root / "gradebook.db")!r}, "gradebook.db")
        os.symlink("/etc", "etc")
        os.mkfifo("toy.html")
        with open("sparse.bin", "wb") as f:
            try:
                f.truncate(10 * 1024 ** 3)
            except OSError:  # over the kernel's file-size limit: as large as it allows
                f.truncate(512 * 1024 ** 2)
        def add(a, b):
            return a + b
        """)
    answers = {"bob": "def add(a, b):\n    return a + b", "mallory": attack_cell}
    for name, answer in answers.items():
        sub = nbformat.from_dict(json.loads(json.dumps(released)))
        sub.cells[0].source = answer
        (root / "submitted" / name / TOY).mkdir(parents=True)
        nbformat.write(sub, root / "submitted" / name / TOY / "toy.ipynb")
    nbgrader("autograde", TOY, "--student", "bob", "--create")
    bob_bytes = bob_nb.read_bytes()
    source_bytes = (root / "source" / TOY / "toy.ipynb").read_bytes()
    nbgrader("autograde", TOY, "--student", "mallory", "--create")

    assert bob_nb.read_bytes() == bob_bytes
    assert (root / "source" / TOY / "toy.ipynb").read_bytes() == source_bytes
    mallory = root / "autograded" / "mallory" / TOY
    kinds = {p.name: stat.S_IFMT(os.lstat(p).st_mode) for p in mallory.iterdir()}
    assert all(k == stat.S_IFREG for k in kinds.values()), kinds
    graded = nbformat.read(mallory / "toy.ipynb", as_version=4)  # her own notebook, executed
    errors = [o for c in graded.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors

    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        assert {n: gb.find_submission(TOY, n).score for n in answers} == {"bob": 2.0, "mallory": 2.0}
    nbgrader("generate_feedback", TOY, "--student", "mallory", "--force", timeout=300)
    feedback = root / "feedback" / "mallory" / TOY
    assert sum(p.stat().st_size for p in feedback.rglob("*") if p.is_file()) < 5 * MIB
