"""The grading sandbox (rlhf_lab/instructor/grader/sandbox.py) with real kernels.

Each test starts kernels the way nbgrader's autograde does (the course's ``Execute`` preprocessor
with the sandboxed kernel manager selected by configuration, the kernel's folder
``autograded/<student>/<assignment>/``), runs student-like code in them and checks from outside
what the code could and could not do.
"""
from __future__ import annotations

import inspect
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest
from traitlets.config import Config

from course_support import REPO, load_module

sandbox = load_module(REPO / "helpers/rlhf_lab/instructor/grader/sandbox.py", "rlhf_lab_course_sandbox")
kernel_guard = sandbox._kernel_guard  # the module the sandboxed manager extends

needs_bwrap = pytest.mark.skipif(sandbox.find_bwrap() is None, reason="bubblewrap (bwrap) is not installed")

ASSIGNMENT = "a2_ppo_rlhf"  # a real assignment name, so the library build strips its functions
NOTEBOOK = "01_losses"


@pytest.fixture
def course(tmp_path):
    """A course folder with the things a kernel must not reach, and one student's notebook folder."""
    root = tmp_path / "course"
    (root / "source" / ASSIGNMENT).mkdir(parents=True)
    (root / "source" / ASSIGNMENT / "hidden.txt").write_text("HIDDEN-TEST-TEXT\n")
    db = root / "gradebook.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table grade (student text, score real)")
        conn.execute("insert into grade values ('alice', 1.0)")
    (root / "autograded" / "bob" / ASSIGNMENT).mkdir(parents=True)
    (root / "autograded" / "bob" / ASSIGNMENT / "answers.txt").write_text("BOB-ANSWERS\n")
    (root / "submitted" / "alice" / ASSIGNMENT).mkdir(parents=True)
    mine = root / "autograded" / "alice" / ASSIGNMENT
    mine.mkdir(parents=True)
    (mine / "data.txt").write_text("MY-DATA\n")
    return root


def run_cells(course: Path, cells: list[str], *, notebook: str = NOTEBOOK, student: str = "alice",
              timeout: int = 60, **manager) -> list[list[dict]]:
    """Run ``cells`` in one kernel started like nbgrader's autograde does; outputs per cell."""
    c = Config()
    c.Execute.kernel_manager_class = sandbox.SandboxedKernelManager
    c.Execute.timeout = timeout
    c.Execute.interrupt_on_timeout = True
    c.Execute.kill_grace = 3
    c.Execute.startup_timeout = 120
    c.SandboxedKernelManager.course_root = str(course)
    c.SandboxedKernelManager.compile_cache_root = ""
    for key, value in manager.items():
        setattr(c.SandboxedKernelManager, key, value)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    ex = kernel_guard.Execute(config=c)
    folder = course / "autograded" / student / ASSIGNMENT
    nb, _ = ex.preprocess(nb, {"metadata": {"path": str(folder)}, "unique_key": notebook})
    return [list(cell.outputs) for cell in nb.cells]


def stdout(outputs: list[dict]) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


def json_out(outputs: list[dict]) -> dict:
    lines = [line for line in stdout(outputs).splitlines() if line.startswith("{")]
    assert lines, outputs
    return json.loads(lines[-1])


PROBE = r'''
import json, os
def attempt(fn):
    try:
        fn()
        return "ok"
    except Exception as exc:
        return type(exc).__name__
def read(p):
    with open(p, "rb") as f:
        f.read()
def write(p):
    with open(p, "ab") as f:
        f.write(b"tampered")
paths = json.loads(PATHS)
out = {name: {"read": attempt(lambda p=p: read(p)), "write": attempt(lambda p=p: write(p)),
              "exists": os.path.exists(p)} for name, p in paths.items()}
out["listdir_root_course"] = attempt(lambda: os.listdir(paths["course"]))
out["cwd"] = os.getcwd()
out["uid"] = os.getuid()
print(json.dumps(out))
'''


@pytest.fixture
def home_probe():
    """A file in the grader's home folder (removed afterwards)."""
    path = Path.home() / f".rlhf-sandbox-probe-{uuid.uuid4().hex}"
    path.write_text("INSTRUCTOR-HOME\n")
    yield path
    path.unlink(missing_ok=True)


@needs_bwrap
def test_kernel_reaches_only_its_own_notebook_folder(course, home_probe):
    paths = {
        "gradebook": str(course / "gradebook.db"),
        "source": str(course / "source" / ASSIGNMENT / "hidden.txt"),
        "classmate": str(course / "autograded" / "bob" / ASSIGNMENT / "answers.txt"),
        "submitted": str(course / "submitted" / "alice" / ASSIGNMENT),
        "git": str(REPO / ".git" / "HEAD"),
        "repo_config": str(REPO / "nbgrader_config.py"),
        "home": str(home_probe),
        "course": str(course),
        "mine": "data.txt",
        "new": "new_file.txt",
    }
    db_before = (course / "gradebook.db").read_bytes()
    owner_before = os.stat(course / "autograded" / "alice" / ASSIGNMENT).st_uid
    out = json_out(run_cells(course, [f"PATHS = {json.dumps(json.dumps(paths))}\n" + PROBE])[0])

    for name in ("gradebook", "source", "classmate", "git", "repo_config", "home"):
        assert out[name] == {"read": "FileNotFoundError", "write": out[name]["write"], "exists": False}, (name, out)
        assert out[name]["write"] in ("FileNotFoundError", "PermissionError", "OSError"), (name, out)
    assert out["submitted"]["exists"] is False
    assert out["listdir_root_course"] == "ok"  # only the path down to the student's own folder
    assert out["mine"] == {"read": "ok", "write": "ok", "exists": True}
    assert out["new"]["write"] == "ok"
    assert out["cwd"] == str(course / "autograded" / "alice" / ASSIGNMENT)
    if os.geteuid() == 0:
        assert out["uid"] != 0  # the kernel never runs as root
    # seen from outside: nothing changed, not even the student's own folder (the kernel wrote
    # into its scratch copy, bound at the folder's path and deleted with the kernel)
    assert (course / "gradebook.db").read_bytes() == db_before
    assert (course / "source" / ASSIGNMENT / "hidden.txt").read_text() == "HIDDEN-TEST-TEXT\n"
    assert (course / "autograded" / "bob" / ASSIGNMENT / "answers.txt").read_text() == "BOB-ANSWERS\n"
    assert home_probe.read_text() == "INSTRUCTOR-HOME\n"
    mine = course / "autograded" / "alice" / ASSIGNMENT
    assert (mine / "data.txt").read_text() == "MY-DATA\n"
    assert sorted(p.name for p in mine.iterdir()) == ["data.txt"]
    # the real folder was never handed to the kernel's user id
    assert os.stat(mine).st_uid == owner_before and os.stat(mine / "data.txt").st_uid == owner_before


@needs_bwrap
def test_no_network_a_private_tmp_and_no_course_secrets_in_the_environment(course, monkeypatch):
    from rlhf_lab.instructor.grader import judge, judge_server

    name = f"rlhf-sandbox-{uuid.uuid4().hex}.txt"
    monkeypatch.setenv("RLHF_COURSE_DB", "postgresql://grader:secret@127.0.0.1/grades")
    # the class run's judge server: its address and key are in the grader's environment, not the kernel's,
    # and its socket is in the grader's /tmp, which the kernel does not see
    judge_srv = judge_server.JudgeServer(warm=False)
    for key, value in judge_srv.env().items():
        monkeypatch.setenv(key, value)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        outs = run_cells(course, [
            f"import os\nopen('/tmp/{name}', 'w').write('x')\nprint(sorted(os.listdir('/tmp')))",
            "print(repr(os.environ.get('RLHF_COURSE_DB')), os.environ['HOME'])",
            "import json, socket\nres = {}\n"
            f"for host, port in (('127.0.0.1', {port}), ('1.1.1.1', 53), ('8.8.8.8', 443)):\n"
            "    try:\n"
            "        socket.create_connection((host, port), timeout=3).close()\n"
            "        res[host] = 'connected'\n"
            "    except OSError as exc:\n"
            "        res[host] = type(exc).__name__\n"
            "print(json.dumps(res))",
            "import json, os, socket\n"
            f"res = {{k: os.environ.get(k) for k in ({judge.ADDRESS_ENV!r}, {judge.AUTHKEY_ENV!r})}}\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "try:\n"
            f"    s.connect({judge_srv.address!r})\n"
            "    res['socket'] = 'connected'\n"
            "except OSError as exc:\n"
            "    res['socket'] = type(exc).__name__\n"
            "print(json.dumps(res))"])
        with pytest.raises(socket.timeout):
            server.accept()  # nobody from the sandbox reached the grader's loopback
    finally:
        server.close()
        judge_srv.close()
    assert json_out(outs[3]) == {judge.ADDRESS_ENV: None, judge.AUTHKEY_ENV: None, "socket": "FileNotFoundError"}
    out = json_out(outs[2])
    assert set(out) == {"127.0.0.1", "1.1.1.1", "8.8.8.8"}
    assert "connected" not in out.values(), out
    assert name in stdout(outs[0])  # the kernel wrote its /tmp file ...
    assert not (Path("/tmp") / name).exists()  # ... which is not the grader's /tmp
    assert stdout(outs[1]).split() == ["None", "/tmp"]


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@needs_bwrap
def test_nothing_the_kernel_starts_outlives_it(course):
    token = f"rlhf-orphan-{uuid.uuid4().hex}"
    sleeper = f"import time; time.sleep(600)  # {token}"
    outs = run_cells(course, [
        "import os, subprocess, sys, time\n"
        # 1. a detached process in its own session
        f"subprocess.Popen([sys.executable, '-c', {sleeper!r}], start_new_session=True,\n"
        "                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        # 2. nohup through a shell, in the background
        f"subprocess.Popen(['/bin/sh', '-c', 'nohup ' + sys.executable + ' -c \"{sleeper}\" >/dev/null 2>&1 &'])\n"
        # 3. a classic daemon: double fork + setsid
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', {sleeper!r}])\n"
        "    os._exit(0)\n"
        "time.sleep(1.5)\n"
        f"print(sum({token!r}.encode() in open(f'/proc/{{p}}/cmdline', 'rb').read()\n"
        "          for p in os.listdir('/proc') if p.isdigit()))",
    ])
    assert stdout(outs[0]).strip() == "3", outs  # all three were running inside the sandbox
    for _ in range(100):  # the namespace is torn down right after the kernel; allow for that
        if not _processes_with(token):
            break
        time.sleep(0.1)
    assert _processes_with(token) == []


@needs_bwrap
def test_a_fork_bomb_hits_the_process_limit_and_the_grader_survives(course):
    outs = run_cells(course, [
        "import os, time\nchildren = []\nerror = None\n"
        "try:\n"
        "    for _ in range(400):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        children.append(pid)\n"
        "except OSError as exc:\n"
        "    error = type(exc).__name__\n"
        "print(len(children), error)\n"
        "for pid in children:\n"
        "    os.kill(pid, 9)\n"
        "    os.waitpid(pid, 0)",
        "print('kernel still answers')",
    ], nproc=64)
    count, error = stdout(outs[0]).split()
    assert error == "BlockingIOError" and 0 < int(count) < 64, outs[0]
    assert stdout(outs[1]).strip() == "kernel still answers"


@needs_bwrap
def test_an_interrupt_at_the_timeout_stops_the_cell_not_the_sandbox(course):
    outs = run_cells(course, ["import time\ntime.sleep(60)", "print('next cell ran')"], timeout=3)
    assert any(o.get("output_type") == "error" for o in outs[0])
    assert not any(o.get("ename") == kernel_guard.KERNEL_STOPPED for o in outs[0]), outs[0]
    assert stdout(outs[1]).strip() == "next cell ran"


@needs_bwrap
@pytest.mark.slow
def test_a_kernel_that_ignores_the_interrupt_or_exits_is_stopped_alone(course):
    hung = run_cells(course, ["import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                              "while True:\n    time.sleep(0.1)", "print('never')"], timeout=3)
    assert hung[0][-1]["ename"] == kernel_guard.KERNEL_STOPPED
    assert hung[1][-1]["ename"] == kernel_guard.NOT_RUN
    died = run_cells(course, ["import os\nos._exit(3)", "print('never')"])
    assert died[0][-1]["ename"] == kernel_guard.KERNEL_STOPPED and died[1][-1]["ename"] == kernel_guard.NOT_RUN
    # and the next kernel of the same folder starts normally
    assert stdout(run_cells(course, ["print('fresh kernel')"])[0]).strip() == "fresh kernel"


def _source_of(name: str) -> str:
    import rlhf_lab.ppo

    return inspect.getsource(getattr(rlhf_lab.ppo, name))


@needs_bwrap
def test_the_library_build_lacks_the_notebooks_functions_and_keeps_the_rest(course):
    body_line = [line for line in _source_of("ppo_loss").splitlines() if "clip" in line][-1].strip()
    outs = run_cells(course, [
        "import json, os, rlhf_lab, rlhf_lab.ppo\nres = {}\n"
        "try:\n    from rlhf_lab import ppo_loss\n    res['import'] = 'ok'\n"
        "except ImportError:\n    res['import'] = 'ImportError'\n"
        "res['getattr'] = hasattr(rlhf_lab.ppo, 'ppo_' + 'loss') or hasattr(rlhf_lab, 'ppo_' + 'loss')\n"
        "res['pref'] = hasattr(rlhf_lab.reward, 'preference' + '_loss')\n"
        "from rlhf_lab import categorical_kl, clipped_surrogate\n"
        "res['given'] = float(categorical_kl(rlhf_lab.ppo.jnp.zeros(3), rlhf_lab.ppo.jnp.zeros(3)))\n"
        "lib = os.path.dirname(rlhf_lab.__file__)\n"
        "res['instructor'] = os.path.exists(os.path.join(lib, 'instructor'))\n"
        "res['judging'] = os.path.exists(os.path.join(lib, 'judging'))\n"
        "text = ''\n"
        "for folder, _, files in os.walk(lib):\n"
        "    for f in files:\n"
        "        if f.endswith('.py'):\n"
        "            text += open(os.path.join(folder, f)).read()\n"
        f"res['source_on_disk'] = {body_line!r} in text\n"
        "res['writable'] = os.access(lib, os.W_OK)\n"
        "print(json.dumps(res))",
    ], library_build="strip")
    res = json_out(outs[0])
    assert res == {"import": "ImportError", "getattr": False, "pref": False, "given": 0.0,
                   "instructor": False, "judging": False, "source_on_disk": False, "writable": False}, res


@needs_bwrap
def test_a_later_notebook_keeps_what_its_given_code_uses(course):
    outs = run_cells(course, [
        "import rlhf_lab.ppo\n"
        "print(hasattr(rlhf_lab.ppo, 'ppo_loss'), hasattr(rlhf_lab.ppo, 'exact_advantages'))"],
        notebook="03_rollouts", library_build="strip")
    # 03_rollouts' students implement exact_advantages; ppo_loss (01's task) is given code there
    assert stdout(outs[0]).split() == ["True", "False"]


def test_grading_refuses_without_bwrap_and_says_how_to_install_it(course, tmp_path, monkeypatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv(sandbox.NO_SANDBOX_ENV, raising=False)
    with pytest.raises(sandbox.SandboxUnavailable) as info:
        run_cells(course, ["print('must not run')"])
    message = str(info.value)
    assert "Refusing to grade" in message and "bwrap" in message
    assert "sudo apt-get install bubblewrap" in message and "user namespaces" in message
    assert sandbox.NO_SANDBOX_ENV + "=1" in message
    with pytest.raises(sandbox.SandboxUnavailable):
        sandbox.check_grading_allowed(env={}, path=str(empty))


def test_opting_out_runs_unsandboxed_and_warns_once(course, tmp_path, monkeypatch, caplog):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", f"{empty}{os.pathsep}{Path(sys.executable).parent}")
    monkeypatch.setenv(sandbox.NO_SANDBOX_ENV, "1")
    monkeypatch.delenv(sandbox.WARNED_ENV, raising=False)
    monkeypatch.setattr(sandbox, "_warned", False)
    gradebook = str(course / "gradebook.db")
    with caplog.at_level("WARNING"):
        first = run_cells(course, [f"import os\nprint(os.path.exists({gradebook!r}))"])
        second = run_cells(course, ["print('again')"])
    assert stdout(first[0]).strip() == "True"  # no sandbox: the gradebook is in reach
    assert stdout(second[0]).strip() == "again"
    warnings = [r for r in caplog.records if "GRADES ARE NOT PROTECTED" in r.getMessage()]
    assert len(warnings) == 1


def test_the_bwrap_command_binds_nothing_of_the_course_only_a_scratch_at_the_notebook_folder(tmp_path):
    cwd = str(tmp_path / "course" / "autograded" / "alice" / "a1")
    cmd = sandbox.bwrap_command("/usr/bin/bwrap", ["python", "-m", "ipykernel_launcher"], cwd=cwd,
                                scratch="/var/tmp/rlhf-scratch-x/work",
                                readonly=[("/build/rlhf_lab", "/lib/rlhf_lab")], writable=["/tmp/rlhf-k-x"],
                                uid=1500000, nproc=99, python="/venv/bin/python", tmp_bytes=123456)
    for flag in ("--unshare-pid", "--unshare-net", "--die-with-parent"):
        assert flag in cmd
    binds = [(cmd[i], cmd[i + 1], cmd[i + 2]) for i, a in enumerate(cmd) if a in ("--bind", "--ro-bind")]
    assert ("--bind", "/var/tmp/rlhf-scratch-x/work", cwd) in binds
    assert ("--ro-bind", "/build/rlhf_lab", "/lib/rlhf_lab") in binds
    assert not any(src.startswith(str(tmp_path)) for _, src, _ in binds)  # not even the notebook folder
    assert ("--ro-bind", "/", "/") not in binds
    tmpfs = cmd.index("/tmp", cmd.index("--tmpfs"))
    assert cmd[tmpfs - 3:tmpfs] == ["--size", "123456", "--tmpfs"]
    tail = cmd[cmd.index("--") + 1:]
    assert tail[0] == "/venv/bin/python"
    assert tail[-5:] == ["1500000", "99", "python", "-m", "ipykernel_launcher"]
    with pytest.raises(ValueError, match="nproc"):
        sandbox.bwrap_command("/usr/bin/bwrap", ["x"], cwd=cwd, scratch="/s", readonly=[], writable=[], uid=-1,
                              nproc=-1, python="p")
    with pytest.raises(ValueError, match="cwd"):
        sandbox.bwrap_command("/usr/bin/bwrap", ["x"], cwd="relative", scratch="/s", readonly=[], writable=[],
                              uid=-1, nproc=0, python="p")
    for scratch, writable in ((cwd, []), ("/s", [cwd])):  # the real folder is never mounted writable
        with pytest.raises(ValueError, match="must not be mounted writable"):
            sandbox.bwrap_command("/usr/bin/bwrap", ["x"], cwd=cwd, scratch=scratch, readonly=[],
                                  writable=writable, uid=-1, nproc=0, python="p")


def test_the_kernel_gets_only_the_library_folder_of_the_graders_pythonpath(tmp_path):
    """The hub's servers import the course library from ``PYTHONPATH`` (their venv has none): a
    sandboxed kernel gets that one folder (bound read-only at the same path), nothing else of it;
    with the library installed in the venv no ``PYTHONPATH`` at all."""
    parent = os.path.dirname(sandbox._installed_library_dir())
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "elsewhere"), parent]), "DATABASE_URL": "secret",
           "JAX_PLATFORMS": "cpu"}
    got = sandbox.sandbox_env(env)
    assert got["PYTHONPATH"] == parent and "DATABASE_URL" not in got and got["JAX_PLATFORMS"] == "cpu"
    assert "PYTHONPATH" not in sandbox.sandbox_env({"PYTHONPATH": str(tmp_path)})
    assert "PYTHONPATH" not in sandbox.sandbox_env({})


def test_each_live_kernel_gets_its_own_user_id_and_a_freed_id_is_reused(tmp_path):
    first = sandbox.UidSlot(2_000_000, span=3, lock_dir=str(tmp_path))
    second = sandbox.UidSlot(2_000_000, span=3, lock_dir=str(tmp_path))
    third = sandbox.UidSlot(2_000_000, span=3, lock_dir=str(tmp_path))
    assert len({first.uid, second.uid, third.uid}) == 3
    assert {first.uid, second.uid, third.uid} <= {2_000_000, 2_000_001, 2_000_002}
    with pytest.raises(sandbox.SandboxUnavailable, match="in use"):
        sandbox.UidSlot(2_000_000, span=3, lock_dir=str(tmp_path))
    second.release()
    assert sandbox.UidSlot(2_000_000, span=3, lock_dir=str(tmp_path)).uid == second.uid
    with pytest.raises(ValueError, match="uid_base"):
        sandbox.UidSlot(0)
    assert sandbox.processes_of(os.getuid())  # this test's own process at least
    assert sandbox.processes_of(2_000_001) == []


# ------------------------------------------------------------------ slow: a real nbgrader autograde
TOY = "toy"
TOY_ANSWERS = {
    "correct": "def add(a, b):\n    return a + b",
    # a correct answer that also tries to reach what the sandbox hides, and leaves a report
    "nosy": ("import json, os, socket\n"
             "report = {'gradebook': os.path.exists(GRADEBOOK), 'source': os.path.exists(SOURCE),\n"
             "          'classmate': os.path.exists(CLASSMATE)}\n"
             "try:\n"
             "    socket.create_connection(('127.0.0.1', 22), timeout=2)\n"
             "    report['net'] = 'connected'\n"
             "except OSError as exc:\n"
             "    report['net'] = type(exc).__name__\n"
             "print('REPORT ' + json.dumps(report))\n"
             "def add(a, b):\n    return a + b"),
    "wrong": "def add(a, b):\n    return a - b",
}


def _nbgrader_env(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RLHF_COURSE_DB", "MPLBACKEND", sandbox.NO_SANDBOX_ENV)}
    env.update(RLHF_COURSE_ROOT=str(root), JAX_PLATFORMS="cpu",
               PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""))
    return env


@needs_bwrap
@pytest.mark.slow
def test_nbgrader_autograde_of_a_toy_course_runs_in_the_sandbox(tmp_path):
    root = tmp_path / "toy_course"
    (root / "source" / TOY).mkdir(parents=True)
    (root / "nbgrader_config.py").write_text((REPO / "nbgrader_config.py").read_text())
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}

    def cell(source, **md):
        c = nbformat.v4.new_code_cell(source)
        c.metadata["nbgrader"] = {"schema_version": 3, "task": False, **md}
        return c

    gradebook, source = root / "gradebook.db", root / "source" / TOY / "toy.ipynb"
    classmate = root / "autograded" / "correct" / TOY / "toy.ipynb"
    nb.cells = [
        cell(f"GRADEBOOK, SOURCE, CLASSMATE = {str(gradebook)!r}, {str(source)!r}, {str(classmate)!r}",
             grade=False, solution=False, locked=True, grade_id="given"),
        cell("def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION",
             grade=False, solution=True, locked=False, grade_id="answer_add"),
        cell("assert add(1, 2) == 3", grade=True, solution=False, locked=True, grade_id="test_add", points=2),
    ]
    nbformat.write(nb, source)
    env = _nbgrader_env(root)
    nbg = [sys.executable, "-m", "nbgrader"]
    proc = subprocess.run(nbg + ["generate_assignment", TOY, "--force"], cwd=root, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    released = nbformat.read(root / "release" / TOY / "toy.ipynb", as_version=4)
    for name, answer in TOY_ANSWERS.items():
        sub = nbformat.from_dict(json.loads(json.dumps(released)))
        sub.cells[1].source = answer
        (root / "submitted" / name / TOY).mkdir(parents=True)
        nbformat.write(sub, root / "submitted" / name / TOY / "toy.ipynb")
    for name in TOY_ANSWERS:  # one nbgrader process per student, as the course pipeline does
        proc = subprocess.run(nbg + ["autograde", TOY, "--student", name, "--create"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr

    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{gradebook}") as gb:
        scores = {name: gb.find_submission(TOY, name).score for name in TOY_ANSWERS}
    assert scores == {"correct": 2.0, "nosy": 2.0, "wrong": 0.0}
    graded = nbformat.read(root / "autograded" / "nosy" / TOY / "toy.ipynb", as_version=4)
    report = next(json.loads(line.split(" ", 1)[1]) for c in graded.cells for o in c.get("outputs", [])
                  for line in o.get("text", "").splitlines() if line.startswith("REPORT "))
    assert report["gradebook"] is False and report["source"] is False and report["classmate"] is False
    assert report["net"] != "connected"
