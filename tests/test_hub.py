"""`make hub` / `make hub-users` (issue 21): a real JupyterHub with real Linux accounts.

Everything here is real: ``useradd``/``chpasswd`` accounts (unique ``t21…`` names, removed with
``userdel -r`` afterwards), PAM logins through the hub's own login form, the Python
``configurable-http-proxy``, ``LocalProcessSpawner`` servers running as each student, nbgrader's
``JupyterHubAuthPlugin`` asking the hub for the course groups, and nbgrader's own
release/fetch/submit/collect through the exchange. Needs root (the hub does); skipped otherwise.
"""
from __future__ import annotations

import csv
import json
import os
import pwd
import re
import secrets
import shutil
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"),
                                reason="creates Linux accounts: needs root and useradd")

from hub_support import (REPO, Class, _as_user, _kernel_eval, _login, _mode, _owner, _page_text,  # noqa: E402
                         _run_hub, _server_pids, _server_session, _shadow, _spawn,
                         make_accounts, running_hub)
from rlhf_lab.instructor.operations import hub as hubmod  # noqa: E402


@pytest.fixture(scope="module")
def klass():
    k = Class()
    try:
        # the second student already has an account (and a password nobody else knows): reused, untouched
        k.passwords[k.students[1]] = "Own-pw-" + secrets.token_hex(4)
        k.add_user(k.students[1], k.passwords[k.students[1]])
        k.outsider_pw = "Out-pw-" + secrets.token_hex(4)
        k.add_user(k.outsider, k.outsider_pw)
        k.shadow_before = _shadow(k.students[1])
        make_accounts(k)
        yield k
    finally:
        k.cleanup()


# --- users ---------------------------------------------------------------------------------------------

def test_users_creates_accounts_course_root_and_exchange(klass):
    a, b = klass.students
    out = klass.users_output
    assert f"created instructor account {klass.instructor}" in out
    assert f"created student account {a}" in out
    assert f"reused student account {b}" in out, out
    for name in (a, klass.instructor):
        home = Path(pwd.getpwnam(name).pw_dir)
        assert _owner(home) == name and _mode(home) == 0o700
    # the password file: once, mode 0600, outside the repository, only the accounts just created
    assert _mode(klass.password_file) == 0o600 and REPO not in klass.password_file.parents
    with open(klass.password_file, newline="") as fh:
        assert {r["id"] for r in csv.DictReader(fh)} == {a, klass.instructor}
    course = klass.top / "course"
    assert _owner(course) == klass.instructor and _mode(course) == 0o700
    assert (course / "source").is_dir() and _owner(course / "source") == klass.instructor
    s = klass.settings()
    for path, owner, mode in hubmod.exchange_layout(s):
        assert (_owner(path), oct(_mode(path))) == (owner, oct(mode)), path


def test_existing_account_reused_never_overwritten(klass):
    b = klass.students[1]
    assert _shadow(b) == klass.shadow_before  # the first run kept b's own password
    again = _run_hub(klass.env, "users")
    assert again.returncode == 0, again.stderr
    assert "created" not in again.stdout.replace("created (", "")  # no account created on a re-run
    for name in klass.students:
        assert f"reused student account {name}" in again.stdout
    assert f"reused instructor account {klass.instructor}" in again.stdout
    assert "passwords of the" not in again.stdout
    assert len(list((klass.top / "state").glob("new-passwords-*.csv"))) == 1
    assert _shadow(b) == klass.shadow_before


def test_roster_id_that_is_no_linux_name_is_rejected_with_its_line(klass, tmp_path):
    good = "t21" + secrets.token_hex(3) + "ok"
    bad = tmp_path / "roster.csv"
    bad.write_text(f"id,first_name\nBad Name,A\n-x,B\n../x,C\n{good},D\n")
    done = _run_hub(dict(klass.env, RLHF_ROSTER=str(bad)), "users")
    assert done.returncode == 2
    assert "line 2: id 'Bad Name'" in done.stderr
    assert "line 3: id '-x'" in done.stderr and "starts with '-'" in done.stderr
    assert "line 4: id '../x'" in done.stderr and "is a path" in done.stderr
    with pytest.raises(KeyError):  # nothing was created, not even the valid line
        pwd.getpwnam(good)


@pytest.mark.parametrize("system", ["root", "daemon", "nobody"])
def test_a_roster_id_that_is_a_system_account_is_refused(klass, tmp_path, system):
    """Reusing an existing account must never hand a student (or whoever knows its password) a
    server with root's or a system account's powers: refused before anything is created."""
    good = "t21" + secrets.token_hex(3) + "ok"
    roster = tmp_path / "roster.csv"
    roster.write_text(f"id,first_name\n{good},A\n{system},B\n")
    done = _run_hub(dict(klass.env, RLHF_ROSTER=str(roster)), "users")
    assert done.returncode == 2, done.stdout
    assert f"{system!r} is a system account of this machine" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(KeyError):
        pwd.getpwnam(good)
    assert any(f"{system!r} is a system account" in p
               for p in hubmod.serve_problems(hubmod.Settings.from_env(env=dict(klass.env, RLHF_ROSTER=str(roster)))))


def test_no_roster_says_what_to_do(klass, tmp_path):
    done = _run_hub(dict(klass.env, RLHF_ROSTER=str(tmp_path / "missing.csv")), "users")
    assert done.returncode == 2 and "no roster" in done.stderr and "ROSTER=path/to/roster.csv" in done.stderr


def test_users_without_root_says_what_to_do(klass):
    done = _run_hub(klass.env, "users", user="nobody")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs root" in done.stderr and "sudo make hub-users" in done.stderr
    assert "Traceback" not in done.stderr
    served = _run_hub(klass.env, "serve", user="nobody")
    assert served.returncode == 2 and "must run as root" in served.stderr and "sudo make hub" in served.stderr


def test_exchange_loosened_mode_is_repaired_and_foreign_owner_refused(klass):
    s = klass.settings()
    inbound = s.exchange / s.course_id / "inbound"
    os.chmod(inbound, 0o777)  # readable by all: students could list each other's submissions
    os.chmod(s.exchange, 0o777)  # the sticky bit gone: a student could rename the course folder
    acl = hubmod.inbound_default_acl(pwd.getpwnam(klass.instructor).pw_uid)
    assert os.getxattr(inbound, hubmod.DEFAULT_ACL) == acl  # hub users set it
    os.removexattr(inbound, hubmod.DEFAULT_ACL)  # submissions would no longer be the instructor's alone
    checked = _run_hub(klass.env, "check")
    assert checked.returncode == 2
    assert f"{inbound}: mode 0777, must be 3733" in checked.stderr
    assert f"{inbound}: no default ACL" in checked.stderr
    assert _mode(inbound) == 0o777  # check changes nothing
    fixed = _run_hub(klass.env, "users")
    assert fixed.returncode == 0, fixed.stderr
    assert f"{inbound}: mode 0777 repaired to 3733" in fixed.stdout
    assert f"{inbound}: default ACL set" in fixed.stdout and os.getxattr(inbound, hubmod.DEFAULT_ACL) == acl
    assert f"{s.exchange}: mode 0777 repaired to 1777" in fixed.stdout
    assert _mode(inbound) == 0o3733 and _mode(s.exchange) == 0o1777
    # a course folder made by a student is refused, not adopted or chowned
    feedback = s.exchange / s.course_id / "feedback"
    student = pwd.getpwnam(klass.students[0])
    os.chown(feedback, student.pw_uid, student.pw_gid)
    try:
        refused = _run_hub(klass.env, "users")
        assert refused.returncode == 2
        assert f"{feedback}: owned by {klass.students[0]}, must be {klass.instructor}; refusing" in refused.stderr
        assert _owner(feedback) == klass.students[0]
    finally:
        inst = pwd.getpwnam(klass.instructor)
        os.chown(feedback, inst.pw_uid, inst.pw_gid)
    assert _run_hub(klass.env, "check").returncode == 0


def test_exchange_must_be_outside_the_course_root_homes_and_repository(klass):
    for inside in (klass.top / "course" / "exchange", Path("/home") / "exchange", REPO / "exchange"):
        env = dict(klass.env, RLHF_EXCHANGE=str(inside))
        refusals, notes = hubmod.exchange_problems(hubmod.Settings.from_env(env=env), repair=True)
        assert len(refusals) == 1 and "must be outside" in refusals[0] and not notes
        assert not inside.exists()


def test_serve_says_what_to_do_on_a_busy_port_or_without_the_proxy(klass, monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _run_hub(dict(klass.env, HUB_PORT=str(port)), "serve")
    assert done.returncode == 2
    assert f"port {port} on 127.0.0.1, the hub's public port (HUB_PORT), is busy" in done.stderr
    assert "HUB_PORT=" in done.stderr
    monkeypatch.setattr(hubmod, "proxy_command", lambda: None)
    problems = hubmod.serve_problems(klass.settings())
    assert any("no configurable-http-proxy" in p and "requirements.txt" in p for p in problems)


# --- the hub -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hub(klass):
    with running_hub(klass) as base:
        yield base


@pytest.mark.slow
def test_hub_login_spawns_each_server_as_its_own_account(klass, hub):
    cid = klass.settings().course_id
    for user in (*klass.students, klass.instructor):
        s, r = _login(hub, user, klass.passwords[user])
        assert r.status_code == 302, _page_text(r.text)[:500]
        model = _spawn(s, hub, user)
        if user == klass.instructor:  # Formgrader on the instructor's own server
            assert s.get(hub + f"/user/{user}/formgrader").status_code == 200
        expected = {f"nbgrader-{cid}"} | ({f"formgrade-{cid}"} if user == klass.instructor else set())
        assert set(model["groups"]) == expected
        pids = _server_pids(user)
        assert pids, f"no server process for {user}"
        for pid in pids:
            uid = pwd.getpwnam(user).pw_uid
            uids = [ln.split()[1:] for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if ln.startswith("Uid:")][0]
            assert uids == [str(uid)] * 4, (user, uids)  # real, effective, saved and filesystem uid
    # what each server's own hub token may do (nbgrader's JupyterHubAuthPlugin uses it): the
    # instructor's adds students to the course group; a student's reads only the student's own record
    a, b = klass.students
    group = f"/groups/nbgrader-{cid}/users"
    for user, checks in ((klass.instructor, [("GET", "/groups", 200), ("POST", group, 200)]),
                         (a, [("GET", f"/users/{a}", 200), ("GET", f"/users/{b}", 404), ("GET", "/groups", 403),
                              ("POST", group, 403), ("DELETE", group, 403)])):
        s, _ = _login(hub, user, klass.passwords[user])
        h = _server_session(s, hub, user)
        code = "import json, os, urllib.request as u\n"
        for method, path, _want in checks:
            code += (f"req = u.Request(os.environ['JUPYTERHUB_API_URL'] + {path!r}, method={method!r}, "
                     f"data=json.dumps({{'users': [{b!r}]}}).encode() if {method!r} != 'GET' else None, "
                     "headers={'Authorization': 'token ' + os.environ['JUPYTERHUB_API_TOKEN'], "
                     "'Content-Type': 'application/json'})\n"
                     "try:\n    print(u.urlopen(req).status)\nexcept u.HTTPError as e:\n    print(e.code)\n")
        got = _kernel_eval(s, hub, user, h, code)
        assert [int(x) for x in got] == [want for _m, _p, want in checks], (user, got)
    # the pre-existing student logged in above with the password they had before: it was not overwritten
    private = klass.top / "state" / "private"  # the hub's database and secrets: root only
    assert _mode(private) == 0o700 and (private / "jupyterhub.sqlite").is_file()
    assert _mode(private / "jupyterhub_cookie_secret") == 0o600 and _mode(private / "proxy_auth_token") == 0o600


@pytest.mark.slow
def test_hub_refuses_a_linux_account_not_on_the_roster(klass, hub):
    s, r = _login(hub, klass.outsider, klass.outsider_pw)
    assert r.status_code == 403
    text = _page_text(r.text)
    assert f"{klass.outsider} is a valid account on this machine but not on the roster" in text
    home = s.get(hub + "/hub/home", allow_redirects=False)  # no hub session either
    assert home.status_code == 302 and "/hub/login" in home.headers["location"]
    assert not _server_pids(klass.outsider)
    s, r = _login(hub, klass.students[0], "not-the-password")
    assert r.status_code == 403 and "Invalid username or password" in _page_text(r.text)


@pytest.mark.slow
def test_hub_release_fetch_submit_collect_between_real_accounts(klass, hub):
    a, b = klass.students
    s = klass.settings()
    assignment = "a1_ppo_objective"
    rel = _as_user(klass, klass.instructor, f"nbgrader release_assignment {assignment} --force")
    assert rel.returncode == 0, rel.stderr[-2000:]
    # student A fetches and submits from their own server (nbgrader's Assignment List API): the
    # course list comes from the hub through JupyterHubAuthPlugin
    sa, r = _login(hub, a, klass.passwords[a])
    _spawn(sa, hub, a)
    h = _server_session(sa, hub, a)
    listed = sa.get(hub + f"/user/{a}/assignments", params={"course_id": s.course_id}, headers=h).json()
    assert listed["success"] and [x["assignment_id"] for x in listed["value"]] == [assignment]
    for action in ("fetch", "submit"):
        r = sa.post(hub + f"/user/{a}/assignments/{action}", json={"course_id": s.course_id, "assignment_id": assignment},
                    headers=h)
        assert r.status_code == 200 and r.json()["success"], r.text[:1000]
    assert (Path(pwd.getpwnam(a).pw_dir) / assignment).is_dir()
    # A's kernel, reached through the proxy's websocket, runs as A and cannot read the course root
    uid, course_listing = _kernel_eval(sa, hub, a, h, f"import os\ntry:\n    os.listdir({str(s.course_root)!r}); r = 'read'\n"
                                       "except PermissionError:\n    r = 'denied'\nprint(os.getuid(), r)")
    assert (int(uid), course_listing) == (pwd.getpwnam(a).pw_uid, "denied")
    # ... and imports the student build of the library: no hidden checks, no instructor tooling, no
    # reference of a task it implements, and nothing of the repository on its path
    code = ("import sys, rlhf_lab\nprint(rlhf_lab.__file__)\n"
            "for name in ('rlhf_lab.judging', 'rlhf_lab.instructor'):\n"
            "    try:\n        __import__(name); print(name + ':imported')\n"
            "    except ModuleNotFoundError:\n        print(name + ':absent')\n"
            f"print(any(p.startswith({str(REPO)!r}) for p in sys.path), hasattr(rlhf_lab.trainer, 'train'), sep=':')")
    where, judging, instructor, repo_on_path = _kernel_eval(sa, hub, a, h, code)
    assert where == str(klass.top / "student-lib" / "rlhf_lab" / "__init__.py")
    assert (judging, instructor) == ("rlhf_lab.judging:absent", "rlhf_lab.instructor:absent")
    assert repo_on_path == "False:False"
    # A's JupyterLab has nbgrader's extensions (the course venv's, also when the servers run from the
    # state folder's Python) with the student configuration: Formgrader and Create Assignment off
    lab = sa.get(hub + f"/user/{a}/lab").text
    config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                  lab, re.S).group(1))
    assert any(e["name"] == "@jupyter/nbgrader" for e in config["federated_extensions"])
    assert {"@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment"} <= set(config["disabledExtensions"])
    # Formgrader is the graders' only: not on a student's server
    assert sa.get(hub + f"/user/{a}/formgrader", headers=h, allow_redirects=False).status_code == 404
    inbound = s.exchange / s.course_id / "inbound"
    (entry,) = [p for p in inbound.iterdir() if p.name.startswith(a + "+")]
    assert _owner(entry) == a
    # student B can neither list the inbound folder, nor rename/delete A's submission, nor read A's home
    spy = _as_user(klass, b, f"ls {inbound}")
    assert spy.returncode != 0 and "Permission denied" in spy.stderr
    move = _as_user(klass, b, f"mv '{entry}' '{inbound}/{b}+{assignment}+x'")
    assert move.returncode != 0 and entry.exists()
    # ... nor read or change anything in it, though B knows its name here: the submission is A's and
    # the instructor's only (nbgrader's own submit leaves it 0644 in a 0777 folder): no bits for other
    # accounts, and the instructor's read is the exchange's default ACL, not a group B could be in
    for path in [entry, *entry.rglob("*")]:
        assert not _mode(path) & 0o007, (path, oct(_mode(path)))
    assert os.getxattr(inbound, hubmod.DEFAULT_ACL) == hubmod.inbound_default_acl(pwd.getpwnam(klass.instructor).pw_uid)
    notebooks = sorted(entry.glob("*.ipynb"))
    assert notebooks
    peek = _as_user(klass, b, f"cat '{notebooks[0]}'")
    assert peek.returncode != 0 and "Permission denied" in peek.stderr
    wipe = _as_user(klass, b, f"rm -f '{entry}/timestamp.txt'; echo x > '{entry}/planted.txt'")
    assert (entry / "timestamp.txt").is_file() and not (entry / "planted.txt").exists()
    assert "Permission denied" in wipe.stderr
    home = _as_user(klass, b, f"ls {pwd.getpwnam(a).pw_dir}")
    assert home.returncode != 0 and "Permission denied" in home.stderr
    course = _as_user(klass, b, f"ls {s.course_root}")
    assert course.returncode != 0 and "Permission denied" in course.stderr
    # the instructor collects: the submission is owned by the student it claims to be, nothing to warn about
    col = _as_user(klass, klass.instructor, f"nbgrader collect {assignment} --update")
    assert col.returncode == 0, col.stderr[-2000:]
    log = col.stdout + col.stderr
    assert f"Collecting submission: {a} {assignment}" in log
    assert "cheating" not in log and "owned by" not in log and "WARNING" not in log, log[-2000:]
    assert (s.course_root / "submitted" / a / assignment).is_dir()
    for path, owner, mode in hubmod.exchange_layout(s):  # nbgrader's commands left the modes as they were
        assert (_owner(path), oct(_mode(path))) == (owner, oct(mode)), path


@pytest.mark.slow
def test_hub_collect_refuses_a_submission_made_in_a_classmates_name_and_keeps_the_exchanges_time(klass, hub):
    """On the hub every student has an account: B writing a folder named as A's into inbound (with a
    time far in the future, so that nbgrader's own collect would pick it as A's latest) is refused and
    reported, A's own submission is collected; A naming a time long before the due date gets the time
    the exchange received it."""
    a, b = klass.students
    s = klass.settings()
    assignment = "a1_ppo_objective"
    rel = _as_user(klass, klass.instructor, f"nbgrader release_assignment {assignment} --force")
    assert rel.returncode == 0, rel.stderr[-2000:]
    inbound = s.exchange / s.course_id / "inbound"
    # a copy the students' accounts can read (the repository may be a folder only root can enter)
    nb = klass.top / "01_clipped_objective.ipynb"
    shutil.copyfile(REPO / "release" / assignment / "01_clipped_objective.ipynb", nb)
    os.chmod(nb, 0o644)
    # A submits with nbgrader, then renames nothing but writes a second, back-dated entry of their own
    sa, _ = _login(hub, a, klass.passwords[a])
    _spawn(sa, hub, a)
    h = _server_session(sa, hub, a)
    for action in ("fetch", "submit"):  # (fetch again is refused when the folder exists: fine)
        r = sa.post(hub + f"/user/{a}/assignments/{action}", json={"course_id": s.course_id, "assignment_id": assignment},
                    headers=h)
        assert r.status_code == 200 and (r.json()["success"] or action == "fetch"), r.text[:1000]
    forged_time = "2000-01-01 00:00:00.000000 UTC"
    back = _as_user(klass, a, f"d='{inbound}/{a}+{assignment}+2000-01-01 00:00:00.000000 UTC+aaaa' && mkdir \"$d\" && "
                              f"cp {nb} \"$d/\" && printf '{forged_time}' > \"$d/timestamp.txt\"")
    assert back.returncode == 0, back.stderr
    # B writes a folder that claims to be A's, dated in the future, with B's "answers"
    forged = f"{inbound}/{a}+{assignment}+2099-01-01 00:00:00.000000 UTC+bbbb"
    fake = _as_user(klass, b, f"mkdir '{forged}' && cp {nb} '{forged}/' && printf 'from B' > '{forged}/marker.txt' "
                              f"&& printf '2099-01-01 00:00:00.000000 UTC' > '{forged}/timestamp.txt'")
    assert fake.returncode == 0, fake.stderr
    col = _as_user(klass, klass.instructor, f"nbgrader collect {assignment} --update")
    log = col.stdout + col.stderr
    assert col.returncode == 0, log[-2000:]
    assert f"submission {Path(forged).name} of student {a!r} was handed in by the Unix account {b!r}" in log, log[-3000:]
    assert "NOT collected" in log and "cheating attempt" not in log
    got = s.course_root / "submitted" / a / assignment
    assert not (got / "marker.txt").exists(), "B's forged folder was collected as A's"
    stamp = (got / "timestamp.txt").read_text()
    assert not stamp.startswith(("2000-", "2099-")), stamp
    from nbgrader.utils import parse_utc
    from datetime import datetime, timezone
    received = parse_utc(stamp)
    assert abs((datetime.now(timezone.utc).replace(tzinfo=None) - received.replace(tzinfo=None)).total_seconds()) < 3600


@pytest.mark.slow
def test_hub_instructor_autogrades_with_the_course_library_in_the_sandboxed_kernel(klass, hub):
    """The hub's servers run a venv without the course library (the instructor's copy comes through
    ``PYTHONPATH``, which the sandbox does not pass on wholesale): the instructor's ``nbgrader
    autograde`` of the collected submission runs the notebook's ``from rlhf_lab import grading`` in
    its sandboxed kernel, and the gradient checks trace the answers there."""
    a = klass.students[0]
    s = klass.settings()
    assignment = "a1_ppo_objective"
    if not (s.course_root / "submitted" / a / assignment).is_dir():
        pytest.skip("the collect test above did not leave A's submission")
    made = _as_user(klass, klass.instructor, f"nbgrader generate_assignment {assignment} --force")
    assert made.returncode == 0, made.stderr[-2000:]
    done = _as_user(klass, klass.instructor, f"nbgrader autograde {assignment} --student {a} --force", timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    graded = sorted((s.course_root / "autograded" / a / assignment).glob("*.ipynb"))
    assert graded
    errors = {}
    for path in graded:
        for cell in json.loads(path.read_text())["cells"]:
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error" and "rlhf_lab" in out.get("evalue", ""):
                    errors[(path.name, cell["metadata"].get("nbgrader", {}).get("grade_id"))] = out["evalue"]
    assert errors == {}
    setup = [c for c in json.loads(graded[0].read_text())["cells"]
             if c["metadata"].get("nbgrader", {}).get("grade_id") == "setup_grading"]
    assert setup and not [o for o in setup[0]["outputs"] if o.get("output_type") == "error"]
