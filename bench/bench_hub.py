"""Load benchmark of the course's JupyterHub (``make hub``, issue 21): N students at once on this machine.

A throw-away class (``max(--sizes)`` students and an instructor, real Linux accounts named ``t21…``,
the hub's course root, exchange and state in a temp folder) is made with ``hub users``, the hub is
started with ``hub serve`` on free ports of 127.0.0.1, and the instructor releases
``a1_ppo_objective`` with ``nbgrader release_assignment`` as that account. Then, for each N of
``--sizes``, N students at once (one thread each, released together by a barrier per step):

1. log in through the hub's login form (PAM, as a browser does);
2. **spawn**: ``POST /hub/api/users/<u>/server``, then poll the user's model until the server is
   ``ready``: the time from the request to the first poll that sees it ready (``--poll`` seconds
   apart, the resolution of the figure);
3. **memory** of each user's processes (every process of that uid: the single-user server; no kernel
   is started), ``--settle`` seconds after the last server became ready: PSS and RSS from
   ``/proc/<pid>/smaps_rollup``, summed per user; and the hub's own process tree (hub + proxy);
4. **fetch** and **submit** of the assignment through nbgrader's Assignment List API of each server
   (``/user/<u>/assignments/fetch|submit``, after the OAuth hop to the server), all at once;
5. **stop**: ``DELETE /hub/api/users/<u>/server`` and poll until it is gone; the fetched folder is
   removed from each home before the next N (a student of an earlier N fetches again).

The machine's load average and cores are recorded before and after each N; the machine is shared
with other programs, so the figures are what was measured under that load, nothing more. The
results and what they imply for 300 students on one VM (an extrapolation) go to ``--out``
(``bench/results/hub.md``). Everything the run made (accounts with ``userdel -r``, processes,
folders) is removed at the end, also on Ctrl-C or a failure. Needs root (the hub does).

Usage: ``sudo .venv/bin/python bench/bench_hub.py [--sizes 1,5,20] [--out bench/results/hub.md]``
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import platform
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python")
MODULE = "rlhf_lab.instructor.operations.hub"
ASSIGNMENT = "a1_ppo_objective"
CLASS_SIZE = 300  # the class the extrapolation is for


# --- pure parts (tests/test_bench_hub.py) -------------------------------------------------------------

def parse_sizes(text: str) -> list[int]:
    """``"1,5,20"`` -> ``[1, 5, 20]`` (positive, in the given order, no repeats)."""
    sizes = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise argparse.ArgumentTypeError(f"--sizes: {part!r} is not a positive whole number")
        if int(part) not in sizes:
            sizes.append(int(part))
    if not sizes:
        raise argparse.ArgumentTypeError("--sizes: give at least one N, e.g. 1,5,20")
    return sizes


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linear between the closest ranks (numpy's
    default): rank ``q/100 * (n-1)`` of the sorted values, counted from 0."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    rank = q / 100 * (len(xs) - 1)
    low = int(rank)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (rank - low)


def summary(values) -> dict | None:
    """``{"n", "median", "p90", "max", "total"}`` of the measured values (None: nothing measured)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return None
    return {"n": len(xs), "median": percentile(xs, 50), "p90": percentile(xs, 90), "max": max(xs),
            "total": sum(xs)}


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:.0f} {unit}"


def table_row(label: str, stats: dict | None, unit: str, of: int) -> str:
    """One markdown row: ``| label | median | p90 | max | measured/of |``."""
    if stats is None:
        return f"| {label} | – | – | – | 0/{of} |"
    return (f"| {label} | {fmt(stats['median'], unit)} | {fmt(stats['p90'], unit)} | {fmt(stats['max'], unit)} "
            f"| {stats['n']}/{of} |")


def size_section(r: dict) -> list[str]:
    """The markdown of one N: its table, total memory, load and failures."""
    n = r["n"]
    lines = [f"### N = {n}", "",
             f"Load average (1/5/15 min) before: {r['load_before']}, after: {r['load_after']}; "
             f"{r['cores']} cores.", "",
             "| per student | median | p90 | max | measured |", "|---|---|---|---|---|"]
    for label, key, unit in (("spawn request -> server ready", "spawn", "s"),
                             ("server memory, idle (PSS)", "pss", "MiB"),
                             ("server memory, idle (RSS)", "rss", "MiB"),
                             ("server memory after fetch+submit (PSS)", "pss_after", "MiB"),
                             ("fetch (Assignment List API)", "fetch", "s"),
                             ("submit (Assignment List API)", "submit", "s"),
                             ("stop (REST DELETE -> gone)", "stop", "s")):
        lines.append(table_row(label, summary(r[key]), unit, n))
    pss, rss = summary(r["pss"]), summary(r["rss"])
    lines += ["", f"All {n} idle servers together: PSS {fmt(pss and pss['total'], 'MiB')}, RSS "
                  f"{fmt(rss and rss['total'], 'MiB')}; the hub and its proxy: PSS {fmt(r.get('hub_pss'), 'MiB')}. "
                  f"All {n} spawns done {fmt(r.get('spawn_wall'), 's')} after the first request."]
    if r.get("errors"):
        lines += ["", "Failures:"] + [f"- {e}" for e in r["errors"]]
    return lines + [""]


def extrapolation(pss_per_server_mib: float, hub_mib: float, ram_mib: float, cores: int,
                  spawn_wall_s: float | None, spawned: int, students: int = CLASS_SIZE,
                  rss_per_server_mib: float | None = None) -> dict:
    """Figures for ``students`` idle servers on one machine, from one measured N (an extrapolation:
    memory linear in the servers, spawns at the measured throughput)."""
    need = pss_per_server_mib * students + hub_mib
    out = {"students": students, "memory_mib": need, "ram_mib": ram_mib, "fraction_of_ram": need / ram_mib,
           "fit_in_ram": int((ram_mib - hub_mib) // pss_per_server_mib) if pss_per_server_mib > 0 else None,
           "cores": cores, "students_per_core": students / cores}
    if rss_per_server_mib:
        out["memory_rss_mib"] = rss_per_server_mib * students + hub_mib
    if spawn_wall_s and spawned:
        out["spawns_per_s"] = spawned / spawn_wall_s
        out["all_spawned_s"] = students / out["spawns_per_s"]
    return out


def extrapolation_lines(x: dict, measured_n: int) -> list[str]:
    lines = [f"- **Memory** (idle servers, no kernel): {x['students']} x the median PSS per server at N = {measured_n} "
             f"+ the hub = {x['memory_mib'] / 1024:.1f} GiB, {100 * x['fraction_of_ram']:.0f} % of this machine's "
             f"{x['ram_mib'] / 1024:.1f} GiB RAM; about {x['fit_in_ram']} such servers would fill it (with nothing "
             "else running)." + (f" Counting every shared page in full (RSS) instead: "
                                  f"{x['memory_rss_mib'] / 1024:.1f} GiB." if "memory_rss_mib" in x else "")]
    if "spawns_per_s" in x:
        lines.append(f"- **Spawns**: at N = {measured_n} the hub brought up {x['spawns_per_s']:.2f} servers per second "
                     f"on {x['cores']} cores; {x['students']} students logging in at once at that rate wait up to "
                     f"{x['all_spawned_s']:.0f} s for the last server (JupyterHub's own limit, "
                     "`JupyterHub.concurrent_spawn_limit`, default 100, refuses spawns beyond it with 429 "
                     "until some finish).")
    lines.append(f"- **CPU**: {x['students_per_core']:.0f} students per core of this machine. What an idle "
                 "server uses of a core was not measured, nor any kernel: every running kernel (the assignments' "
                 "numpy/JAX) takes memory and CPU on top of the figures above.")
    return lines


def scaling_lines(results: list[dict]) -> list[str]:
    """Each N's medians as a ratio to the smallest N's of the same run (the baseline): how spawn,
    fetch, submit and one server's memory grow with the number of students at once."""
    rows = [r for r in results if summary(r["spawn"])]
    if len(rows) < 2:
        return []
    base = min(rows, key=lambda r: r["n"])
    lines = [f"## Relative to N = {base['n']} of the same run", "",
             f"Medians at each N divided by the medians at N = {base['n']}, measured minutes apart in this run "
             "(1.00: no slower than one student alone).", "",
             "| N | spawn -> ready | fetch | submit | server PSS |", "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["n"]):
        cells = []
        for key in ("spawn", "fetch", "submit", "pss"):
            here, there = summary(r[key]), summary(base[key])
            cells.append(f"{here['median'] / there['median']:.2f}x" if here and there and there["median"] else "–")
        lines.append(f"| {r['n']} | " + " | ".join(cells) + " |")
    return lines + [""]


def busy(load_before: str, cores_: int) -> bool:
    """Whether other programs held the machine when an N started: a 1-minute load average above half
    its cores."""
    return float(load_before.split("/")[0]) > cores_ / 2


def report(results: list[dict], meta: dict) -> str:
    """The whole ``bench/results/hub.md``."""
    lines = ["# The course's JupyterHub under N simultaneous students", "",
             f"Measured {meta['when']} on {meta['host']} ({meta['cores']} cores, {meta['ram_mib'] / 1024:.1f} GiB RAM, "
             f"Python {meta['python']}) by `bench/bench_hub.py --sizes {','.join(str(r['n']) for r in results)}`.",
             "",
             "Each N: N real Linux accounts of a throw-away class log in through the hub's login form, spawn "
             "their servers at once through the REST API (LocalProcessSpawner, each as its own account), "
             f"then fetch and submit `{ASSIGNMENT}` at once through nbgrader's Assignment List API of their "
             "servers, then stop them (REST DELETE). Spawn time: from the request to the first poll of the "
             f"user's model that shows `ready` (polled every {meta['poll']} s). Memory: PSS and RSS summed over "
             "every process of the student's account (`/proc/<pid>/smaps_rollup`), "
             f"{meta['settle']} s after the last server was ready, before any kernel; PSS shares a library's "
             "pages among the processes that map it, so it is what one more server adds.",
             ""]
    if any(busy(r["load_before"], r["cores"]) for r in results):
        lines += ["**This machine is shared**: other programs held it when an N started (a 1-minute load "
                  "above half its cores; the load averages are given with each N). The figures are what was "
                  "measured under that load, not the hub's speed on a quiet machine.", ""]
    else:
        lines += ["The machine was otherwise quiet: every N started with a 1-minute load average at most "
                  "half its cores (given with each N; the load after an N is the run's own).", ""]
    for r in results:
        lines += size_section(r)
    lines += scaling_lines(results)
    big = max((r for r in results if summary(r["pss"])), key=lambda r: r["n"], default=None)
    lines += ["## What this implies for a class of 300 on one VM (extrapolation)", "",
              f"*Extrapolated from N <= {max(r['n'] for r in results)} on this machine, not measured with 300.*", ""]
    if big is None:
        lines.append("No server's memory was measured: nothing to extrapolate from.")
    else:
        x = extrapolation(summary(big["pss"])["median"], big.get("hub_pss") or 0.0, meta["ram_mib"], meta["cores"],
                          big.get("spawn_wall"), summary(big["spawn"])["n"] if summary(big["spawn"]) else 0,
                          rss_per_server_mib=summary(big["rss"])["median"] if summary(big["rss"]) else None)
        lines += extrapolation_lines(x, big["n"])
    lines += ["- **The culler**: the one-server hub of `make hub` (`hub/jupyterhub_config.py`) has no idle "
              "culler, so every server stays up until its student stops it or the hub stops; for a class of 300 "
              "the TLJH configuration (`deploy/tljh/config.yaml`: `services.cull`, idle servers stopped after "
              "3600 s, checked every 300 s, users kept) and Z2JH's `cull` bound the number of servers to those "
              "used in the last hour. What an idle server costs is the PSS above; a student who keeps a kernel "
              "running is not idle and is not culled.",
              "- Not measured here: kernels (their memory dominates once students run the notebooks), more than "
              f"{max(r['n'] for r in results)} servers at once, a browser's many requests per page.", ""]
    return "\n".join(lines)


# --- the machine -------------------------------------------------------------------------------------

def load_text() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def ram_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def smaps(pid: int) -> tuple[float, float]:
    """(PSS, RSS) of one process in MiB (0, 0 when it is gone)."""
    pss = rss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith("Rss:"):
                rss = int(line.split()[1])
    except (OSError, ValueError):
        return 0.0, 0.0
    return pss / 1024, rss / 1024


def pids_of(uids) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    out.append(int(entry))
            except FileNotFoundError:
                pass
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


# --- the throw-away class and its hub ----------------------------------------------------------------

def free_base_port() -> int:
    """A port with the next two also free (the hub uses three)."""
    from rlhf_lab.instructor.operations import hub as hubmod

    return hubmod.free_ports(3)


class Class:
    """``size`` students and an instructor, real accounts ``t21<hex>s<k>``/``t21<hex>i``, folders in a temp dir."""

    def __init__(self, size: int):
        tag = "t21" + secrets.token_hex(3)
        self.students = [f"{tag}s{k:03d}" for k in range(size)]
        self.instructor = f"{tag}i"
        self.top = Path(tempfile.mkdtemp(prefix="bench-hub-"))
        os.chmod(self.top, 0o755)
        self.roster = self.top / "roster.csv"
        self.roster.write_text("id,first_name,last_name,email,lms_user_id\n"
                               + "".join(f"{s},Bench,Student{i},,\n" for i, s in enumerate(self.students)))
        os.chmod(self.roster, 0o644)
        self.port = free_base_port()
        self.env = dict(os.environ, RLHF_ROSTER=str(self.roster), RLHF_HUB_INSTRUCTOR=self.instructor,
                        RLHF_HUB_COURSE=str(self.top / "course"), RLHF_EXCHANGE=str(self.top / "nbx" / "exchange"),
                        RLHF_HUB_STATE=str(self.top / "state"), HUB_PORT=str(self.port),
                        RLHF_STUDENT_LIB=str(self.top / "student-lib"), JAX_PLATFORMS="cpu")
        self.passwords: dict = {}
        self.hub: subprocess.Popen | None = None
        self.log = None
        self.base = f"http://127.0.0.1:{self.port}"
        self.course_id = self.settings().course_id  # read once: ast.parse in 20 threads at once is not safe on 3.11

    def uids(self, names=None) -> set:
        out = set()
        for name in names or (*self.students, self.instructor):
            try:
                out.add(pwd.getpwnam(name).pw_uid)
            except KeyError:
                pass
        return out

    def settings(self):
        from rlhf_lab.instructor.operations import hub as hubmod
        return hubmod.Settings.from_env(env=self.env)

    def make_accounts(self) -> None:
        done = subprocess.run([PY, "-m", MODULE, "users"], env=self.env, capture_output=True, text=True,
                              timeout=900, cwd="/")
        if done.returncode != 0:
            raise RuntimeError(f"hub users failed:\n{done.stderr[-3000:]}")
        for path in (self.top / "state").glob("new-passwords-*.csv"):
            with open(path, newline="") as fh:
                self.passwords.update({r["id"]: r["password"] for r in csv.DictReader(fh)})
        missing = [n for n in (*self.students, self.instructor) if n not in self.passwords]
        if missing:
            raise RuntimeError(f"hub users made no password for {missing} (accounts that existed before?)")

    def start_hub(self) -> None:
        import requests

        self.log = open(self.top / "hub.log", "w")
        self.hub = subprocess.Popen([PY, "-m", MODULE, "serve"], env=self.env, stdout=self.log,
                                    stderr=subprocess.STDOUT, cwd="/", start_new_session=True)
        for _ in range(600):
            if self.hub.poll() is not None:
                raise RuntimeError("the hub stopped:\n" + self.log_tail())
            try:
                if requests.get(self.base + "/hub/login", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        raise RuntimeError("the hub did not come up in 300 s:\n" + self.log_tail())

    def log_tail(self) -> str:
        try:
            return (self.top / "hub.log").read_text()[-3000:]
        except OSError:
            return ""

    def as_user(self, user: str, command: str, timeout: int = 600) -> subprocess.CompletedProcess:
        """``command`` (sh) as ``user`` with the environment the hub gives that user's server."""
        from rlhf_lab.instructor.operations import hub as hubmod

        s = self.settings()
        runtime = Path(s.state) / "venv" / "bin"
        libraries = {"student": self.top / "student-lib", "instructor": s.course_root / ".library"}
        env = hubmod.server_env(s, user, runtime, hubmod.write_server_configs(s), libraries)
        env.update(HOME=pwd.getpwnam(user).pw_dir, USER=user)
        return subprocess.run(["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--init-groups",
                               "sh", "-c", command], env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=env.get("RLHF_COURSE_ROOT", pwd.getpwnam(user).pw_dir))

    def release(self) -> None:
        done = self.as_user(self.instructor, f"nbgrader release_assignment {ASSIGNMENT} --force")
        if done.returncode != 0:
            raise RuntimeError(f"release_assignment failed:\n{(done.stdout + done.stderr)[-3000:]}")

    def hub_pss(self) -> float | None:
        """PSS (MiB) of the hub and its proxy: the hub's process tree without the class's servers
        (LocalProcessSpawner starts them as the hub's children)."""
        if self.hub is None or self.hub.poll() is not None:
            return None
        ours = set(pids_of(self.uids()))
        return sum(smaps(p)[0] for p in tree(self.hub.pid) if p not in ours)

    def cleanup(self) -> list[str]:
        """Stop the hub, every process of the class's accounts, remove the accounts and the folders;
        returns what could not be removed."""
        left = []
        if self.hub is not None and self.hub.poll() is None:
            self.hub.send_signal(signal.SIGTERM)  # the hub stops every server and its proxy
            try:
                self.hub.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.hub.pid, signal.SIGKILL)
                self.hub.wait()
        if self.hub is not None:
            try:  # the proxy runs in the hub's session: nothing of it may outlive the run
                os.killpg(self.hub.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.log:
            self.log.close()
        uids = self.uids()
        for _ in range(3):
            for pid in pids_of(uids):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not pids_of(uids):
                break
            time.sleep(0.5)
        names = {p.pw_name for p in pwd.getpwall()}
        for name in (*self.students, self.instructor):
            if name in names:
                done = subprocess.run(["userdel", "-r", name], capture_output=True, text=True)
                if done.returncode not in (0, 12):  # 12: could not remove the home (reported below)
                    left.append(f"account {name}: userdel exit {done.returncode} {done.stderr.strip()}")
        shutil.rmtree(self.top, ignore_errors=True)
        if self.top.exists():
            left.append(f"folder {self.top}")
        return left


# --- one student's steps (run in threads) ------------------------------------------------------------

def _hub_xsrf(session, base) -> dict:
    import re
    token = re.search(r'xsrf_token: "([^"]+)"', session.get(base + "/hub/home", timeout=60).text).group(1)
    return {"X-XSRFToken": token}


class Student:
    def __init__(self, klass: Class, name: str, poll: float):
        self.k, self.name, self.poll = klass, name, poll
        self.session = None
        self.hub_headers: dict = {}
        self.server_headers: dict = {}

    def login(self) -> None:
        import requests

        s = requests.Session()
        s.get(self.k.base + "/hub/login", timeout=60).raise_for_status()
        r = s.post(self.k.base + "/hub/login", timeout=120, allow_redirects=False,
                   data={"username": self.name, "password": self.k.passwords[self.name], "_xsrf": s.cookies["_xsrf"]})
        if r.status_code != 302:
            raise RuntimeError(f"login of {self.name}: HTTP {r.status_code}")
        self.session = s
        self.hub_headers = _hub_xsrf(s, self.k.base)

    def model(self) -> dict:
        return self.session.get(self.k.base + f"/hub/api/users/{self.name}", headers=self.hub_headers,
                                timeout=60).json()

    def spawn(self, timeout: float = 300) -> None:
        r = self.session.post(self.k.base + f"/hub/api/users/{self.name}/server", headers=self.hub_headers,
                              json={}, timeout=timeout)
        if r.status_code not in (201, 202):
            raise RuntimeError(f"spawn of {self.name}: HTTP {r.status_code} {r.text[:200]}")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            server = self.model().get("servers", {}).get("") or {}
            if server.get("ready"):
                return
            if not server:  # neither pending nor ready: the spawn failed
                raise RuntimeError(f"spawn of {self.name} failed (see the hub's log)")
            time.sleep(self.poll)
        raise RuntimeError(f"server of {self.name} not ready after {timeout:.0f} s")

    def open_server(self) -> None:
        r = self.session.get(self.k.base + f"/user/{self.name}/lab", timeout=300)
        if r.status_code != 200:
            raise RuntimeError(f"JupyterLab of {self.name}: HTTP {r.status_code}")
        token = [c.value for c in self.session.cookies if c.name == "_xsrf" and c.path.startswith(f"/user/{self.name}")]
        self.server_headers = {"X-XSRFToken": token[0]}

    def assignment(self, action: str) -> None:
        r = self.session.post(self.k.base + f"/user/{self.name}/assignments/{action}", headers=self.server_headers,
                              json={"course_id": self.k.course_id, "assignment_id": ASSIGNMENT},
                              timeout=600)
        if r.status_code != 200 or not r.json().get("success"):
            raise RuntimeError(f"{action} of {self.name}: HTTP {r.status_code} {r.text[:300]}")

    def stop(self, timeout: float = 120) -> None:
        r = self.session.delete(self.k.base + f"/hub/api/users/{self.name}/server", headers=self.hub_headers,
                                timeout=timeout)
        if r.status_code not in (202, 204):
            raise RuntimeError(f"stop of {self.name}: HTTP {r.status_code} {r.text[:200]}")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not (self.model().get("servers") or {}).get(""):
                return
            time.sleep(self.poll)
        raise RuntimeError(f"server of {self.name} still there {timeout:.0f} s after DELETE")


def at_once(students: list[Student], step) -> tuple[list, list[str]]:
    """``step(student)`` in one thread per student, all released together; returns each one's
    seconds (None when it failed) and the failures."""
    barrier = threading.Barrier(len(students))

    def one(st):
        try:
            barrier.wait(timeout=300)
        except threading.BrokenBarrierError:
            return None, f"{st.name}: the others never got ready for this step"
        t0 = time.monotonic()
        try:
            step(st)
        except Exception as exc:  # recorded, the benchmark goes on with the others
            return None, f"{st.name}: {type(exc).__name__}: {exc}"
        return time.monotonic() - t0, None

    with ThreadPoolExecutor(max_workers=len(students)) as pool:
        got = list(pool.map(one, students))
    return [t for t, _ in got], [e for _, e in got if e]


def one_size(klass: Class, n: int, poll: float, settle: float, say) -> dict:
    students = [Student(klass, name, poll) for name in klass.students[:n]]
    r = {"n": n, "cores": cores(), "load_before": load_text(), "errors": []}
    say(f"N={n}: load {r['load_before']}; logging in")
    _, errors = at_once(students, Student.login)
    r["errors"] += errors
    live = [s for s in students if s.session is not None]
    say(f"N={n}: spawning {len(live)} servers at once")
    t0 = time.monotonic()
    spawn_times, errors = at_once(live, Student.spawn) if live else ([], [])
    r["spawn_wall"] = time.monotonic() - t0 if any(t is not None for t in spawn_times) else None
    r["spawn"], r["errors"] = spawn_times, r["errors"] + errors
    ready = [s for s, t in zip(live, spawn_times) if t is not None]
    time.sleep(settle)
    mem = {s.name: [smaps(p) for p in pids_of(klass.uids([s.name]))] for s in ready}
    r["pss"] = [sum(m[0] for m in mem[s.name]) for s in ready]
    r["rss"] = [sum(m[1] for m in mem[s.name]) for s in ready]
    r["processes"] = [len(mem[s.name]) for s in ready]
    r["hub_pss"] = klass.hub_pss()
    say(f"N={n}: {len(ready)} ready; fetch and submit at once")
    _, errors = at_once(ready, Student.open_server) if ready else ([], [])
    r["errors"] += errors
    opened = [s for s in ready if s.server_headers]
    r["fetch"], errors = at_once(opened, lambda s: s.assignment("fetch")) if opened else ([], [])
    r["errors"] += errors
    fetched = [s for s, t in zip(opened, r["fetch"]) if t is not None]
    r["submit"], errors = at_once(fetched, lambda s: s.assignment("submit")) if fetched else ([], [])
    r["errors"] += errors
    r["pss_after"] = [sum(smaps(p)[0] for p in pids_of(klass.uids([s.name]))) for s in ready]
    say(f"N={n}: stopping the servers")
    r["stop"], errors = at_once(live, Student.stop) if live else ([], [])
    r["errors"] += errors
    left = pids_of(klass.uids([s.name for s in students]))
    if left:
        r["errors"].append(f"{len(left)} processes of the students still running after their servers were stopped")
    for s in students:  # the next N fetches again
        shutil.rmtree(Path(pwd.getpwnam(s.name).pw_dir) / ASSIGNMENT, ignore_errors=True)
    r["load_after"] = load_text()
    say(f"N={n}: done; load {r['load_after']}")
    return r


# --- command line ------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Needs root: it creates (and removes) Linux accounts and runs the hub.")
    ap.add_argument("--sizes", type=parse_sizes, default=[1, 5, 20],
                    help="numbers of simultaneous students, comma-separated (default 1,5,20)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "hub.md", help="the results (markdown)")
    ap.add_argument("--poll", type=float, default=0.5, help="seconds between polls of a server's state (default 0.5)")
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds after the last server is ready before memory is read (default 5)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print(f"bench_hub: needs root (it creates Linux accounts and starts the hub, which runs each student's "
              f"server as that account); you are {pwd.getpwuid(os.geteuid()).pw_name}. Run it as root, e.g. "
              f"`sudo {PY} bench/bench_hub.py`.", file=sys.stderr)
        return 2
    for tool in ("useradd", "userdel", "chpasswd", "setpriv"):
        if not shutil.which(tool):
            print(f"bench_hub: needs {tool} (Debian: passwd / util-linux)", file=sys.stderr)
            return 2

    def say(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with SIGINT ignored (`cmd &`)

    meta = {"when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "host": platform.node(),
            "cores": cores(), "ram_mib": ram_mib(), "python": platform.python_version(), "poll": args.poll,
            "settle": args.settle}
    klass = None
    results = []
    code = 0
    try:
        klass = Class(max(args.sizes))
        say(f"class of {len(klass.students)} students in {klass.top}; hub users")
        klass.make_accounts()
        say(f"starting the hub on 127.0.0.1:{klass.port}")
        klass.start_hub()
        say(f"releasing {ASSIGNMENT} as {klass.instructor}")
        klass.release()
        for n in args.sizes:
            results.append(one_size(klass, n, args.poll, args.settle, say))
    except KeyboardInterrupt:
        print("bench_hub: interrupted; cleaning up", file=sys.stderr)
        code = 130
    except Exception as exc:
        print(f"bench_hub: {type(exc).__name__}: {exc}", file=sys.stderr)
        if klass is not None:
            print(klass.log_tail(), file=sys.stderr)
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup itself is not interrupted
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if klass is not None:
            left = klass.cleanup()
            say("cleaned up: accounts removed, hub stopped" + (f"; LEFT: {left}" if left else ""))
    if code == 0 and results:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report(results, meta), encoding="utf-8")
        say(f"results: {args.out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
