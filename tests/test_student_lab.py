"""`make student-lab STUDENT=<id>` (rlhf_lab/instructor/operations/student_lab.py): one private home
per roster student on a shared login, nothing written into the repository."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from course_support import REPO, kill_tree

MODULE = "rlhf_lab.instructor.operations.student_lab"
ROSTER = REPO / "examples" / "roster.csv"


def _run(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", MODULE, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=cwd or REPO)


def _dry_run(sid, homes, *extra):
    proc = _run(sid, "--roster", str(ROSTER), "--homes", str(homes), "--student-lib", str(homes / "no-lib"),
                "--dry-run", *extra)
    assert proc.returncode == 0, proc.stderr
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line and line[:1].isupper()
               and not line.startswith(" "))
    return proc.stdout, env


def _repo_state() -> tuple[str, list[str]]:
    """What a student's lab could write into the repository: git's view of jupyter/ and the top
    level (ignored files included: JupyterLab's lab/ and migrated are gitignored)."""
    status = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all", "--", "jupyter"],
                            capture_output=True, text=True, cwd=REPO, check=True).stdout
    return status, sorted(os.listdir(REPO))


def test_an_id_not_in_the_roster_is_refused_and_names_the_id_and_the_roster(tmp_path):
    proc = _run("zed_nobody", "--roster", str(ROSTER), "--homes", str(tmp_path), "--dry-run")
    assert proc.returncode == 2
    assert "'zed_nobody' is not in the roster" in proc.stderr and str(ROSTER) in proc.stderr
    assert not (tmp_path / "zed_nobody").exists()
    # the roster comes from $RLHF_ROSTER as well
    other = tmp_path / "roster.csv"
    other.write_text("id,first_name,last_name\nzoe,Zoe,Quist\n")
    proc = _run("ada_correct", "--homes", str(tmp_path), "--dry-run", env={"RLHF_ROSTER": str(other)})
    assert proc.returncode == 2 and str(other) in proc.stderr
    assert _run("zoe", "--homes", str(tmp_path), "--dry-run", env={"RLHF_ROSTER": str(other)}).returncode == 0
    assert "name the student" in _run("--dry-run").stderr


def test_two_students_get_different_private_homes_caches_workspaces_and_ids(tmp_path):
    out_a, env_a = _dry_run("ada_correct", tmp_path, "--", "--port=8899", "--allow-root")
    out_b, env_b = _dry_run("ben_unchanged", tmp_path)
    assert "submitting as ada_correct (Ada Okafor)" in out_a and "submitting as ben_unchanged" in out_b
    assert env_a["RLHF_STUDENT_ID"] == "ada_correct" and env_b["RLHF_STUDENT_ID"] == "ben_unchanged"
    for var in ("HOME", "JUPYTER_DATA_DIR", "JUPYTER_CONFIG_DIR", "JUPYTERLAB_WORKSPACES_DIR",
                "JUPYTERLAB_SETTINGS_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        assert env_a[var] != env_b[var], var
        assert Path(env_a[var]).is_relative_to(tmp_path / "ada_correct"), var
        assert Path(env_b[var]).is_relative_to(tmp_path / "ben_unchanged"), var
    for sid in ("ada_correct", "ben_unchanged"):
        assert stat.S_IMODE(os.stat(tmp_path / sid).st_mode) == 0o700
        config = tmp_path / sid / "jupyter" / "config"
        assert (config / "nbgrader_config.py").is_file() and (config / "labconfig" / "page_config.json").is_file()
        assert not (config / "lab").exists() and not (config / "migrated").exists()
    # nbgrader's cache (submissions, feedback) is $JUPYTER_DATA_DIR/nbgrader_cache: one per student
    probe = "from nbgrader.exchange.default.exchange import Exchange; print(Exchange().cache)"
    caches = {sid: subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True,
                                  text=True, check=True).stdout.strip()
              for sid, env in (("ada_correct", env_a), ("ben_unchanged", env_b))}
    assert caches["ada_correct"] == str(tmp_path / "ada_correct" / "jupyter" / "data" / "nbgrader_cache")
    assert caches["ben_unchanged"] == str(tmp_path / "ben_unchanged" / "jupyter" / "data" / "nbgrader_cache")
    assert out_a.strip().splitlines()[-1].endswith(
        f"lab --ServerApp.root_dir={tmp_path / 'ada_correct' / 'work'} --port=8899 --allow-root")


def test_the_students_nbgrader_config_files_submissions_under_their_id(tmp_path):
    _, env = _dry_run("ada_correct", tmp_path)
    probe = ("from traitlets.config.loader import PyFileConfigLoader; import os\n"
             "c = PyFileConfigLoader('nbgrader_config.py', path=os.environ['JUPYTER_CONFIG_DIR']).load_config()\n"
             "print(c.CourseDirectory.student_id, c.Exchange.root)")
    out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["ada_correct", env["RLHF_EXCHANGE"]]


def test_a_home_inside_the_repository_is_refused():
    before = _repo_state()
    proc = _run("ada_correct", "--roster", str(ROSTER), "--homes", str(REPO / "student-homes"), "--dry-run")
    assert proc.returncode == 2 and "inside" in proc.stderr
    assert not (REPO / "student-homes").exists()
    assert _repo_state() == before


def test_the_student_build_is_on_the_kernels_path_when_there_is_one(tmp_path):
    lib = tmp_path / "lib"
    (lib / "rlhf_lab").mkdir(parents=True)
    (lib / "rlhf_lab" / "__init__.py").write_text("")
    (lib / "STUDENT_BUILD.json").write_text("{}")
    proc = _run("ada_correct", "--roster", str(ROSTER), "--homes", str(tmp_path), "--student-lib", str(lib),
                "--dry-run")
    assert f"PYTHONPATH={lib}" in proc.stdout and "the student build" in proc.stdout
    _, env = _dry_run("ada_correct", tmp_path)
    assert "PYTHONPATH" not in env


@pytest.mark.slow
def test_a_real_student_lab_writes_into_the_students_home_and_nothing_into_the_repository(tmp_path):
    before = _repo_state()
    homes = tmp_path / "homes"
    env = {"RLHF_EXCHANGE": str(tmp_path / "exchange"), "JAX_PLATFORMS": "cpu"}
    args = ["ada_correct", "--roster", str(ROSTER), "--homes", str(homes), "--student-lib", str(tmp_path / "none"),
            "--", "--no-browser", "--port=0", "--ServerApp.token=t", "--ServerApp.port_retries=0"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    proc = subprocess.Popen([sys.executable, "-m", MODULE, *args], env={**os.environ, **env}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    home = homes / "ada_correct"
    runtime = home / "jupyter" / "runtime"
    try:
        info = None
        for _ in range(600):
            found = sorted(runtime.glob("jpserver-*.json")) if runtime.is_dir() else []
            if found:
                info = json.loads(found[0].read_text())
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        assert info is not None, "the lab did not start"
        base = f"http://127.0.0.1:{info['port']}"
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{base}/api/status?token=t", timeout=5).read()
                break
            except OSError:
                time.sleep(0.2)
        # a workspace save, as the browser does when a student opens a notebook
        req = urllib.request.Request(f"{base}/lab/api/workspaces/default?token=t", method="PUT",
                                     data=json.dumps({"data": {}, "metadata": {"id": "default"}}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()
        assert info["root_dir"] == str(home / "work")
    finally:
        kill_tree(proc)
    assert list((home / "jupyter" / "lab" / "workspaces").glob("*.jupyterlab-workspace"))
    assert _repo_state() == before
