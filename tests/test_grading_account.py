"""The course command never grades as root when the course belongs to an instructor account.

* The decision (:func:`course.grading_account`, :func:`course.ownership_refusal`): which uid, gid and
  groups for which owner of the course root, and the one line that refuses to grade while what the
  account must write belongs to root. Fake passwd entries and ``lstat``: no account is needed.
* For real (root only, skipped otherwise): a throw-away account ``t18grader…`` owns a copy of the
  course in its home; the course command's autograde of one student, started as root, writes an
  autograded notebook owned by that account and the same grade as the account's own run.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import types
import uuid
from pathlib import Path

import pytest

from rlhf_lab.instructor import course


def _entry(name, uid, gid, home):
    return types.SimpleNamespace(pw_name=name, pw_uid=uid, pw_gid=gid, pw_dir=home)


def test_root_grading_an_instructors_course_runs_as_the_instructor():
    passwd = {1234: _entry("ins", 1234, 2000, "/home/ins")}.__getitem__
    account = course.grading_account(0, 1234, passwd=passwd, grouplist=lambda name, gid: [gid, 27, 3001])
    assert account == course.Account("ins", 1234, 2000, (2000, 27, 3001), "/home/ins")
    assert account.popen_kwargs() == {"user": 1234, "group": 2000, "extra_groups": [2000, 27, 3001]}
    env = account.env({"HOME": "/root", "USER": "root", "XDG_RUNTIME_DIR": "/run/user/0", "PATH": "/bin"})
    assert env == {"HOME": "/home/ins", "USER": "ins", "LOGNAME": "ins", "PATH": "/bin"}


@pytest.mark.parametrize("euid, owner", [(0, 0), (1234, 1234), (1234, 0), (1234, 999)])
def test_no_change_of_account_unless_root_grades_another_accounts_course(euid, owner):
    def passwd(uid):
        raise AssertionError("no account is looked up")

    assert course.grading_account(euid, owner, passwd=passwd, grouplist=passwd) is None


def test_an_owner_without_a_passwd_entry_keeps_the_current_account():
    def passwd(uid):
        raise KeyError(uid)

    assert course.grading_account(0, 4321, passwd=passwd) is None


def test_root_owned_outputs_are_refused_in_one_line_with_the_fix(tmp_path):
    account = course.Account("ins", 1234, 2000, (2000,), "/home/ins")
    root = tmp_path / "c"
    paths = course.account_outputs(root, "sqlite:///" + str(root / "gradebook.db"))
    assert paths == [str(root / n) for n in ("gradebook.db", "autograded", "feedback", "submitted")]
    owners = {str(root / "gradebook.db"): 1234, str(root / "autograded"): 0, str(root / "submitted"): 1234}

    def lstat(path):
        if path not in owners:
            raise FileNotFoundError(path)
        return types.SimpleNamespace(st_uid=owners[path])

    foreign = course.foreign_outputs(paths, 1234, lstat=lstat)
    assert foreign == [(str(root / "autograded"), 0)]
    line = course.ownership_refusal(account, foreign)
    assert "\n" not in line
    assert f"{root / 'autograded'} is owned by root" in line
    assert line.endswith(f"chown -R ins {root / 'autograded'}")
    assert course.ownership_refusal(account, course.foreign_outputs(paths, 0, lstat=lambda p: lstat(p) if
                                                                    "auto" in p else (_ for _ in ()).throw(
                                                                        FileNotFoundError(p)))) is None
    assert course.ownership_refusal(account, []) is None
    assert "gradebook.db" not in " ".join(course.account_outputs(root, "postgresql://h/db"))


def test_a_root_owned_course_run_by_root_says_so_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(course.os, "geteuid", lambda: 0)
    monkeypatch.setenv(course.NOTICE_ENV, "")  # restored after the test: the call below sets it
    if os.stat(tmp_path).st_uid != 0:
        pytest.skip("needs a folder owned by root")
    assert course.account_for_course(tmp_path) == (None, None)
    assert course.account_for_course(tmp_path) == (None, None)
    err = capsys.readouterr().err
    assert err.count("grading and feedback run confined") == 1 and f"chown -R <instructor> {tmp_path}" in err
    # a process started afterwards (a pool's worker) inherits that it was said, for this root only
    assert course.NOTICE_ENV in os.environ and str(tmp_path) in os.environ[course.NOTICE_ENV].split(os.pathsep)
    other = tmp_path / "other"
    other.mkdir()
    assert course.account_for_course(tmp_path) == (None, None)
    assert course.account_for_course(other) == (None, None)
    err = capsys.readouterr().err
    assert err.count("grading and feedback run confined") == 1 and f"chown -R <instructor> {other})" in err


# ------------------------------------------------------------------------------------------------
# a real account (root only)

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"),
                                reason="creates a Linux account: needs root and useradd")


@pytest.fixture(scope="module")
def runtime(request):
    """A Python every account can run with the course venv's packages (the hub's servers' copy,
    hard links, :func:`hub.server_runtime`), the library from this checkout on ``PYTHONPATH``: the
    venv's own interpreter may sit in a folder only root can enter (a pyenv Python under ``/root``)."""
    import tempfile

    from rlhf_lab.instructor.operations import hub

    helpers = Path(course.REPO_ROOT) / "helpers"
    if not hub._usable_by_all(helpers / "rlhf_lab" / "instructor" / "classrun"):
        pytest.skip(f"other accounts cannot read this checkout ({helpers}): clone it into a folder they can enter")
    state = Path(tempfile.mkdtemp(prefix="t18-runtime-", dir="/var/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(state, ignore_errors=True))
    os.chmod(state, 0o755)
    try:
        python = hub.server_runtime(types.SimpleNamespace(state=state / "state")) / "python"
    except hub.HubError as exc:
        pytest.skip(f"no Python every account can run: {exc}")
    return str(python), str(helpers)


def _python(runtime, code, cwd, env, **as_user):
    """``code`` run by the runtime's Python (as root, or as ``as_user``'s Popen ``user``...); its
    last output line as JSON."""
    python, helpers = runtime
    env = dict(env, PYTHONPATH=helpers, PATH=str(Path(python).parent) + os.pathsep + env.get("PATH", ""))
    done = subprocess.run([python, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800,
                          **as_user)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _autograde_code(root, assignment, student):
    return ("import json; from rlhf_lab.instructor.classrun import pipeline; "
            f"runs = pipeline.autograde({assignment!r}, {student!r}, root={str(root)!r}, "
            f"db_url={'sqlite:///' + str(Path(root) / 'gradebook.db')!r}); "
            "print(json.dumps([[r.ok, r.reason] for r in runs]))")


@pytest.fixture
def grader_account(request):
    name = "t18grader" + uuid.uuid4().hex[:6]
    subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name], check=True)

    def remove():
        subprocess.run(["userdel", "-r", name], check=False, capture_output=True)

    request.addfinalizer(remove)
    return pwd.getpwnam(name)


def _course_for(entry, tmp_path_factory, student, assignment, notebooks, name="course", seeds=True):
    """A fresh copy of the course in the account's home, with one submission, all the account's
    (``seeds=False``: without compile-cache seeds, for a run that stops before any kernel)."""
    from course_support import fresh_course, session_base, write_submissions

    home = Path(entry.pw_dir)
    root = fresh_course(home / name, session_base(tmp_path_factory), seeds=seeds)
    write_submissions(root / "submitted", {student: {assignment: notebooks}})
    subprocess.run(["chown", "-R", f"{entry.pw_name}:{entry.pw_name}", str(home)], check=True)
    os.chmod(home, 0o700)
    return root


def _score(root, assignment, student):
    from nbgrader.api import Gradebook

    with Gradebook("sqlite:///" + str(Path(root) / "gradebook.db")) as gb:
        return gb.find_submission(assignment, student).score


@pytest.mark.slow  # two real autogrades of a1, as a real account (about 2.5 min)
@needs_root
def test_the_course_command_grades_as_the_course_owner_with_the_same_grade(grader_account, runtime,
                                                                         tmp_path_factory):
    from course_support import correct_submission, replace_cell
    from nbgrader.api import Gradebook

    assignment, student = "a1_ppo_objective", "alice"
    notebooks = correct_submission(assignment)
    first = sorted(notebooks)[0]
    notebooks[first] = replace_cell(notebooks[first], "ppo_surrogate",
                                    "def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):\n"
                                    "    return ratio * advantage\n")
    entry = grader_account
    by_root = _course_for(entry, tmp_path_factory, student, assignment, notebooks)
    by_itself = _course_for(entry, tmp_path_factory, student, assignment, notebooks, name="course2")

    # the course command started by root
    assert _python(runtime, _autograde_code(by_root, assignment, student), by_root,
                   course.nbgrader_env(by_root)) == [[True, ""]]
    written = list((by_root / "autograded" / student / assignment).glob("*.ipynb"))
    assert written, "no autograded notebook"
    for path in [*written, by_root / "autograded" / student, by_root / "gradebook.db"]:
        assert os.stat(path).st_uid == entry.pw_uid, path
    as_root = _score(by_root, assignment, student)
    [log] = [p for p in by_root.rglob(f"{student}.log") if "autograded" not in p.parts]
    assert "unavailable" not in log.read_text(), "nbgrader could not reach the run's judge server"

    # the same submission in a second copy, graded by the account itself from its own process
    env = course.Account(entry.pw_name, entry.pw_uid, entry.pw_gid, (entry.pw_gid,), entry.pw_dir).env(
        course.nbgrader_env(by_itself))
    assert _python(runtime, _autograde_code(by_itself, assignment, student), by_itself, env,
                   user=entry.pw_uid, group=entry.pw_gid, extra_groups=[entry.pw_gid]) == [[True, ""]]
    assert _score(by_itself, assignment, student) == as_root
    with Gradebook("sqlite:///" + str(by_root / "gradebook.db")) as gb:
        best = gb.find_assignment(assignment).max_score
    assert 0 < as_root < best  # the wrong surrogate lost its points, the rest earned theirs


@needs_root
def test_a_root_owned_output_folder_stops_the_run_with_the_fix(grader_account, runtime, tmp_path_factory):
    from course_support import correct_submission

    assignment, student = "a1_ppo_objective", "bob"
    root = _course_for(grader_account, tmp_path_factory, student, assignment, correct_submission(assignment),
                       seeds=False)
    os.chown(root / "autograded", 0, 0)  # left by an earlier run as root
    [[ok, reason]] = _python(runtime, _autograde_code(root, assignment, student), root, course.nbgrader_env(root))
    assert not ok and f"chown -R {grader_account.pw_name} {root / 'autograded'}" in reason
    assert not list((root / "autograded").iterdir())


@needs_root
def test_an_account_that_cannot_run_the_courses_python_is_told_so(grader_account, tmp_path_factory):
    """This process's own Python, which the account may not reach (a pyenv Python under /root):
    either it grades as the account, or the run stops with the line that says why."""
    from course_support import correct_submission

    python = os.path.realpath(sys.executable)
    try:
        reached = subprocess.run(course.reach_check(course.nbgrader_command()), capture_output=True, cwd="/",
                                 user=grader_account.pw_uid, group=grader_account.pw_gid,
                                 extra_groups=[]).returncode == 0
    except PermissionError:
        reached = False
    if reached:
        pytest.skip(f"the account can run {python}: nothing to refuse")
    assignment, student = "a1_ppo_objective", "carol"
    root = _course_for(grader_account, tmp_path_factory, student, assignment, correct_submission(assignment),
                       seeds=False)
    run = course.run_nbgrader(["autograde", assignment, "--student", student], root)
    assert not run.ok and run.seconds == 0.0
    assert f"cannot run this course's Python {sys.executable}" in run.output
    assert f"run the course command as {grader_account.pw_name}" in run.output
