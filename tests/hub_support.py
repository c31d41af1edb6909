"""Shared support of the hub tests (tests/test_hub.py, tests/test_hub_browser.py), issue 21.

A throw-away class of real Linux accounts (:class:`Class`: ``t21…`` names, removed with
``userdel -r``), the real hub started and stopped around a test (:func:`running_hub`), and the ways
a test talks to it: the hub's login form (:func:`_login`), a server spawned through the REST API
(:func:`_spawn`), the OAuth hop to a user's server (:func:`_server_session`), code run in a kernel
of that server over its websocket (:func:`_kernel_eval`), a shell command as a user with the
environment the hub gives their server (:func:`_as_user`). Needs root (the callers skip without it).
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from rlhf_lab.instructor.operations import hub as hubmod

REPO = Path(__file__).resolve().parents[1]
PY = str(REPO / ".venv" / "bin" / "python")
MODULE = "rlhf_lab.instructor.operations.hub"


def _free_base_port() -> int:
    """A port with the next two also free (the hub uses three)."""
    return hubmod.free_ports(3)


def _procs_of(uids) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    out.append(int(entry))
            except FileNotFoundError:
                pass
    return out


def _run_hub(env, *args, user=None, timeout=120):
    cmd = [PY, "-m", MODULE, *args]
    if user:  # as another account, with a Python that account can run (the servers' one) and a copy of
        # the library it can read (the repository may be a folder only root can enter, as CI's clone is)
        checkout = Path(env["RLHF_HUB_STATE"]).parent / "checkout-for-others"
        if not checkout.is_dir():  # the library and the course config, laid out as in the repository
            hubmod._linked_copy(REPO / "helpers" / "rlhf_lab", checkout / "helpers" / "rlhf_lab")
            shutil.copyfile(REPO / "nbgrader_config.py", checkout / "nbgrader_config.py")
        env = dict(env, PYTHONPATH=str(checkout / "helpers"))
        cmd = ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--clear-groups",
               str(Path(env["RLHF_HUB_STATE"]) / "venv" / "bin" / "python"), "-m", MODULE, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd="/")


class Class:
    """A throw-away class: a roster of two students, an instructor, the hub's folders under /tmp."""

    def __init__(self):
        tag = "t21" + secrets.token_hex(3)
        self.students = [f"{tag}a", f"{tag}b"]
        self.instructor = f"{tag}i"
        self.outsider = f"{tag}x"  # a Linux account that is not on the roster
        self.top = Path(tempfile.mkdtemp(prefix="h21-"))
        os.chmod(self.top, 0o755)
        self.roster = self.top / "roster.csv"
        self.roster.write_text("id,first_name,last_name,email,lms_user_id\n"
                               + "".join(f"{s},First,Last{i},,\n" for i, s in enumerate(self.students)))
        os.chmod(self.roster, 0o644)
        self.port = _free_base_port()
        self.env = dict(os.environ, RLHF_ROSTER=str(self.roster), RLHF_HUB_INSTRUCTOR=self.instructor,
                        RLHF_HUB_COURSE=str(self.top / "course"), RLHF_EXCHANGE=str(self.top / "nbx" / "exchange"),
                        RLHF_HUB_STATE=str(self.top / "state"), HUB_PORT=str(self.port),
                        RLHF_STUDENT_LIB=str(self.top / "student-lib"),
                        JAX_PLATFORMS="cpu")
        self.passwords: dict = {}
        self.made = []

    def add_user(self, name, password):
        subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name], check=True)
        subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True)
        self.made.append(name)

    def settings(self):
        return hubmod.Settings.from_env(env=self.env)

    def cleanup(self):
        names = set(self.made) | set(self.students) | {self.instructor, self.outsider}
        uids = set()
        for name in names:
            try:
                uids.add(pwd.getpwnam(name).pw_uid)
            except KeyError:
                pass
        for pid in _procs_of(uids):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for name in names:
            if name in {p.pw_name for p in pwd.getpwall()}:
                subprocess.run(["userdel", "-r", name], capture_output=True)
        shutil.rmtree(self.top, ignore_errors=True)


def _shadow(name) -> str:
    for line in Path("/etc/shadow").read_text().splitlines():
        if line.split(":", 1)[0] == name:
            return line.split(":")[1]
    raise KeyError(name)


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _owner(path) -> str:
    return pwd.getpwuid(os.lstat(path).st_uid).pw_name


def _proxy_pids(port) -> list[int]:
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(c.endswith(b"configurable-http-proxy") for c in cmd) and str(port).encode() in cmd:
            out.append(int(entry))
    return out


def _login(base, user, password):
    import requests

    s = requests.Session()
    s.get(base + "/hub/login").raise_for_status()
    r = s.post(base + "/hub/login", data={"username": user, "password": password, "_xsrf": s.cookies["_xsrf"]},
               allow_redirects=False)
    return s, r


def _page_text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"(?s)<script.*?</script>|<[^>]+>", " ", html))


def _hub_xsrf(s, base) -> dict:
    token = re.search(r'xsrf_token: "([^"]+)"', s.get(base + "/hub/home").text).group(1)
    return {"X-XSRFToken": token}


def _spawn(s, base, user) -> dict:
    h = _hub_xsrf(s, base)
    r = s.post(base + f"/hub/api/users/{user}/server", headers=h, json={})
    assert r.status_code in (201, 202) or "is already running" in r.text, r.text
    for _ in range(360):
        model = s.get(base + f"/hub/api/users/{user}", headers=h).json()
        if (model.get("servers", {}).get("") or {}).get("ready"):
            return model
        time.sleep(0.5)
    raise AssertionError(f"server of {user} never became ready: {model}")


def _server_pids(user) -> list[int]:
    """Processes that are ``user``'s single-user server (by the environment the hub gave them)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(c.endswith(b"jupyterhub-singleuser") for c in cmd) and f"JUPYTERHUB_USER={user}".encode() in env:
            out.append(int(entry))
    return out


def _server_session(s, base, user) -> dict:
    """Open ``user``'s JupyterLab (the OAuth hop to the server) and return the server's XSRF header."""
    r = s.get(base + f"/user/{user}/lab")
    assert r.status_code == 200, r.status_code
    token = [c.value for c in s.cookies if c.name == "_xsrf" and c.path.startswith(f"/user/{user}")]
    return {"X-XSRFToken": token[0]}


def _as_user(klass, user, command, timeout=300):
    """``command`` (sh) as ``user`` with the environment the hub gives that user's server."""
    s = klass.settings()
    runtime = Path(s.state) / "venv" / "bin"
    libraries = {"student": klass.top / "student-lib", "instructor": s.course_root / ".library"}
    env = hubmod.server_env(s, user, runtime, hubmod.write_server_configs(s), libraries)
    env.update(HOME=pwd.getpwnam(user).pw_dir, USER=user)
    return subprocess.run(["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--init-groups",
                           "sh", "-c", command], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=env.get("RLHF_COURSE_ROOT", pwd.getpwnam(user).pw_dir))


def _kernel_eval(s, base, user, h, code) -> list[str]:
    """Run ``code`` in a new kernel of ``user``'s server over the websocket; its stdout, split."""
    import uuid

    import websocket

    kid = s.post(base + f"/user/{user}/api/kernels", headers=h, json={"name": "python3"}).json()["id"]
    try:
        url = base.replace("http://", "ws://") + f"/user/{user}/api/kernels/{kid}/channels"
        cookie = "; ".join(f"{c.name}={c.value}" for c in s.cookies if c.name != "_xsrf" or c.path.startswith(f"/user/{user}"))
        ws = websocket.create_connection(url, cookie=cookie, timeout=120, header=[f"X-XSRFToken: {h['X-XSRFToken']}"])
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": user,
                                       "session": uuid.uuid4().hex, "version": "5.3"},
                            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                            "content": {"code": code, "silent": False, "store_history": False,
                                        "user_expressions": {}, "allow_stdin": False}}))
        out = ""
        for _ in range(500):
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out += msg["content"]["text"]
            if msg["msg_type"] == "error":
                raise AssertionError(msg["content"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        ws.close()
        return out.split()
    finally:
        s.delete(base + f"/user/{user}/api/kernels/{kid}", headers=h)



def make_accounts(klass) -> None:
    """``hub users`` for ``klass`` (accounts, course root, exchange); the new passwords into ``klass.passwords``."""
    done = _run_hub(klass.env, "users")
    assert done.returncode == 0, done.stderr
    klass.users_output = done.stdout
    files = sorted((klass.top / "state").glob("new-passwords-*.csv"))
    assert len(files) == 1, files
    klass.password_file = files[0]
    with open(files[0], newline="") as fh:
        klass.passwords.update({r["id"]: r["password"] for r in csv.DictReader(fh)})


@contextlib.contextmanager
def running_hub(klass):
    """``hub serve`` for ``klass``; yields the hub's base URL once its login page answers. On exit the
    hub is stopped (SIGTERM: it stops every server and its proxy) and nothing of the class's accounts
    or the proxy may be left running."""
    import requests

    log = open(klass.top / "hub.log", "w")
    proc = subprocess.Popen([PY, "-m", MODULE, "serve"], env=klass.env, stdout=log, stderr=subprocess.STDOUT,
                            cwd="/", start_new_session=True)
    base = f"http://127.0.0.1:{klass.port}"
    try:
        for _ in range(240):
            assert proc.poll() is None, (klass.top / "hub.log").read_text()[-3000:]
            try:
                if requests.get(base + "/hub/login", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError("hub did not come up:\n" + (klass.top / "hub.log").read_text()[-3000:])
        assert _proxy_pids(klass.port), "the hub runs without the Python configurable-http-proxy"
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        users = {pwd.getpwnam(n).pw_uid for n in (*klass.students, klass.instructor)}
        for _ in range(40):
            if not _procs_of(users):
                break
            time.sleep(0.5)
        left = _procs_of(users)
        assert not left, f"servers left running after the hub stopped: {left}"
        assert not _proxy_pids(klass.port), "the proxy outlived the hub"
