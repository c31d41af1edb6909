"""Grading and feedback as root on a root-owned course run confined (``rlhf_lab.instructor.confine``).

The fast tests check the pieces (when a run is confined, which student a command line names, the
command lines that start nbgrader again) and, as root with bubblewrap, the confinement itself: a
probe run in exactly the command the course builds for ``nbgrader autograde a1 --student=ada``
tries every write a grader following a planted link could make and reports which failed.

The slow tests grade a real course as root through each autograde path (the course command's
class run, bare ``nbgrader autograde`` / ``nbgrader generate_feedback`` typed in the course root,
and Formgrader's API in this process): the course copy's ``nbgrader_config.py`` ends with a probe
that, in every nbgrader process that grades or writes feedback, tries the same writes and records
the result. Every such process must have been confined, and the grades must still be right.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlhf_lab.instructor import confine, course

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="confinement applies to root only")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


# ------------------------------------------------------------------------------------------ pieces
def test_only_root_on_a_root_owned_course_grading_or_writing_feedback_is_confined(tmp_path, monkeypatch):
    monkeypatch.delenv(confine.ENV_MARK, raising=False)
    monkeypatch.setattr(confine.os, "geteuid", lambda: 0)
    owner = {"uid": 0}
    real_stat = os.stat
    monkeypatch.setattr(confine.os, "stat", lambda p, *a, **k: type("S", (), {"st_uid": owner["uid"]})()
                        if str(p) == str(tmp_path) else real_stat(p, *a, **k))
    assert confine.needed(tmp_path, "autograde") and confine.needed(tmp_path, "generate_feedback")
    for other in ("generate_assignment", "collect", "export", "db", "validate", ""):
        assert not confine.needed(tmp_path, other), other
    owner["uid"] = 1234  # the course command grades as that account instead
    assert not confine.needed(tmp_path, "autograde")
    owner["uid"] = 0
    monkeypatch.setenv(confine.ENV_MARK, "1")  # already inside
    assert not confine.needed(tmp_path, "autograde")
    monkeypatch.delenv(confine.ENV_MARK)
    monkeypatch.setattr(confine.os, "geteuid", lambda: 1000)
    assert not confine.needed(tmp_path, "autograde")


@pytest.mark.parametrize("args, student", [
    (["autograde", "a1", "--student=ada"], "ada"),
    (["autograde", "a1", "--student", "ben_unchanged"], "ben_unchanged"),
    (["autograde", "a1", "--student=we[[]ird]"], "we[ird]"),  # glob.escape-d name
    (["autograde", "a1"], None),
    (["autograde", "a1", "--student=a*"], None),
    (["autograde", "a1", "--student=*"], None),
    (["autograde", "a1", "--student=.."], None),
    (["autograde", "a1", "--student=x/y"], None),
    (["autograde", "a1", "--student"], None),
])
def test_the_one_student_a_command_names(args, student):
    assert confine.student_of(args) == student


def test_the_command_lines_that_start_nbgrader_again():
    assert confine.cli_command(["/v/bin/nbgrader", "autograde", "a1"]) == [sys.executable, "/v/bin/nbgrader",
                                                                          "autograde", "a1"]
    main = "/v/lib/python3.11/site-packages/nbgrader/__main__.py"
    assert confine.cli_command([main, "generate_feedback", "a1"]) == [sys.executable, "-m", "nbgrader",
                                                                      "generate_feedback", "a1"]
    assert confine.cli_command(["/x/classrun/nbgrader_cli.py", "autograde"])[1:] == ["/x/classrun/nbgrader_cli.py",
                                                                                     "autograde"]
    for server in (["/v/bin/jupyter-lab"], ["/v/bin/pytest", "-q"], ["-c"], []):
        assert confine.cli_command(server) is None
    assert confine.subcommand_of(["--debug", "autograde", "a1"]) == "autograde"
    assert confine.id_map(1_500_000, 4096) == "0 0 1\n1500000 1500000 4096\n"


def test_without_bubblewrap_root_grades_nothing_and_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv(confine.ENV_MARK, raising=False)
    monkeypatch.setattr(confine.os, "geteuid", lambda: 0)
    monkeypatch.setattr(confine.shutil, "which", lambda name: None)
    real_stat = os.stat
    monkeypatch.setattr(confine.os, "stat", lambda p, *a, **k: type("S", (), {"st_uid": 0})()
                        if str(p) == str(tmp_path) else real_stat(p, *a, **k))
    cmd = [*course.nbgrader_command(), "autograde", "a1", "--student=ada"]
    same, refusal = course.confine_if_root(cmd, tmp_path)
    assert same == cmd and refusal.startswith("not grading: bubblewrap (bwrap) is not installed")
    run = course.run_nbgrader(["autograde", "a1", "--student=ada"], tmp_path, "sqlite:///" + str(tmp_path / "g.db"))
    assert run.returncode == 1 and "not grading: bubblewrap" in run.output
    assert run.args[1:] == ["autograde", "a1", "--student=ada"]  # the nbgrader command, not the wrapper


def test_not_root_nothing_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(confine.os, "geteuid", lambda: 1000)
    cmd = ["setpriv", "--pdeathsig=TERM", "--", *course.nbgrader_command(), "autograde", "a1"]
    assert course.confine_if_root(cmd, tmp_path) == (cmd, None)
    confine.reexec_if_needed(tmp_path, ["/v/bin/nbgrader", "autograde", "a1"])  # returns: nothing to do


def test_the_formgrader_steps_are_sent_to_a_confined_subprocess_only_when_needed(tmp_path, monkeypatch):
    from nbgrader import converters

    monkeypatch.setattr(confine.os, "geteuid", lambda: 0)
    monkeypatch.setattr(confine, "cli_command", lambda argv: None)  # a Jupyter server, not nbgrader's CLI
    sent, ran = [], []
    for cls in (converters.Autograde, converters.GenerateFeedback):  # nbgrader's own start, recorded
        monkeypatch.setattr(cls, "start", lambda self, _n=cls.__name__: ran.append(_n))
    monkeypatch.setattr(confine, "run_step_confined", lambda app, sub, root, db: sent.append((sub, root, db)))
    confine.confine_formgrader("sqlite:////elsewhere/gradebook.db")
    confine.confine_formgrader()  # twice: patched once
    needed = {"answer": True}
    monkeypatch.setattr(confine, "needed", lambda root, sub: needed["answer"])
    app = type("App", (), {"coursedir": type("C", (), {"root": str(tmp_path)})()})()
    converters.Autograde.start(app)
    converters.GenerateFeedback.start(app)
    assert sent == [("autograde", str(tmp_path), "sqlite:////elsewhere/gradebook.db"),
                    ("generate_feedback", str(tmp_path), "sqlite:////elsewhere/gradebook.db")] and ran == []
    needed["answer"] = False  # not root's course: nbgrader's own start, in this process
    converters.Autograde.start(app)
    converters.GenerateFeedback.start(app)
    assert len(sent) == 2 and ran == ["Autograde", "GenerateFeedback"]


def test_log_lines_of_the_subprocess_keep_their_level():
    assert confine.log_record("[AutogradeApp | WARNING] 3 points withheld") == ("WARNING", "3 points withheld")
    assert confine.log_record("\x1b[33m[AutogradeApp | ERROR]\x1b[0m bad notebook") == ("ERROR", "bad notebook")
    assert confine.log_record("Traceback (most recent call last):", "ERROR") == ("ERROR",
                                                                                 "Traceback (most recent call last):")
    assert confine.log_record("plain", "INFO") == ("INFO", "plain")


# --------------------------------------------------------------------------- the confinement itself
#: What a grader that follows a planted link could write, relative to the course root (ada is the
#: student being graded, zed a classmate); ``+`` marks what grading must still be able to write
#: (ada's submitted folder: the pre-flight moves what must not run out of it).
TARGETS = {
    "source/PROBE": "-", "release/PROBE": "-", "nbgrader_config.py": "-", "submitted/ada/PROBE": "+",
    "submitted/zed/PROBE": "-", "autograded/zed/PROBE": "-", "feedback/zed/PROBE": "-",
    ".cache/jax-compile-seed/PROBE": "-", "exchange/PROBE": "-", "planted-link-to-source": "-",
    "autograded/ada/PROBE": "+", "integrity/PROBE": "+", ".cache/PROBE": "+", "gradebook.db": "+",
    "NEW-TOP-LEVEL-ENTRY": "+",
}
PROBE = textwrap.dedent('''
    import ctypes, errno, json, os, sys
    root, base = sys.argv[1], int(sys.argv[2])
    def attempt(path):
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
            return "written"
        except OSError as exc:
            return errno.errorcode.get(exc.errno, str(exc.errno))
    out = {name: attempt(os.path.join(root, name)) for name in json.loads(sys.argv[3])}
    out["/etc"] = attempt("/etc/rlhf-confine-probe")
    out["/usr/lib"] = attempt("/usr/lib/rlhf-confine-probe")
    out["/tmp"] = attempt("/tmp/rlhf-confine-probe-%d" % os.getpid())
    out["uid_map"] = open("/proc/self/uid_map").read().split()
    out["marked"] = os.environ.get("RLHF_CONFINED")
    out["ipythondir"] = os.environ.get("IPYTHONDIR")
    try:
        open(os.path.join(root, "private-of-1001")).read()
        out["private"] = "read"
    except OSError as exc:
        out["private"] = errno.errorcode[exc.errno]
    libc = ctypes.CDLL(None, use_errno=True)
    MS_REMOUNT, MS_BIND = 32, 4096
    out["remount"] = libc.mount(None, os.path.join(root, "source").encode(), None, MS_REMOUNT | MS_BIND, None)
    out["umount"] = libc.umount2(os.path.join(root, "source").encode(), 2)
    def as_uid(uid):
        pid = os.fork()
        if pid == 0:
            try:
                os.setresuid(uid, uid, uid)
                os._exit(0)
            except OSError:
                os._exit(1)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out["setuid_slot"] = as_uid(base + 7)
    out["setuid_other"] = as_uid(1001)
    print(json.dumps(out))
''')


def probe_course(root: Path) -> Path:
    """A course root owned by root with one file in each folder a grader could be tricked into writing."""
    for folder in ("source", "release", "submitted/ada", "submitted/zed", "autograded/zed", "feedback/zed",
                   ".cache/jax-compile-seed", "exchange", "integrity"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for name in ("nbgrader_config.py", "gradebook.db", "source/x.ipynb"):
        (root / name).write_text("# kept\n")
    (root / "planted-link-to-source").symlink_to(root / "source" / "PROBE-THROUGH-LINK")
    private = root / "private-of-1001"
    private.write_text("an instructor's secret\n")
    os.chown(private, 1001, 1001)
    private.chmod(0o600)
    return root


@as_root
@needs_bwrap
def test_the_confined_command_writes_only_what_grading_writes(tmp_path, monkeypatch):
    monkeypatch.delenv(confine.ENV_MARK, raising=False)
    scratch = tmp_path / "tmpdir"  # this test's own temporary folder: other tests' confinements use /tmp
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    root = probe_course(tmp_path / "course")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    cmd, refusal = course.confine_if_root([*course.nbgrader_command(), "autograde", "a1", "--student=ada"], root)
    assert refusal is None and cmd[0] == shutil.which("bwrap")
    stage2 = cmd.index(confine.__file__)
    assert cmd[stage2 + 4] == "--" and cmd[stage2 + 5:] == [*course.nbgrader_command(), "autograde", "a1",
                                                            "--student=ada"]
    base = confine.uid_base()
    probe = cmd[:stage2 + 5] + [sys.executable, "-c", PROBE, str(root), str(base), json.dumps(list(TARGETS))]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for name, allowed in TARGETS.items():
        assert (out[name] == "written") == (allowed == "+"), (name, out[name])
        if allowed == "-":
            assert out[name] == "EROFS", (name, out[name])
    assert out["/etc"] == out["/usr/lib"] == "EROFS" and out["/tmp"] == "written"
    assert out["uid_map"] == ["0", "0", "1", str(base), str(base), str(confine.UID_SPAN)]
    assert out["marked"] == "1"
    assert out["ipythondir"].startswith(str(scratch / "rlhf-confined-"))  # the home folder checked below
    assert out["private"] == "EACCES"  # root inside has no power over an unmapped account's file
    assert out["remount"] == -1 and out["umount"] == -1
    assert out["setuid_slot"] == 0 and out["setuid_other"] == 1
    assert not (root / "source" / "PROBE-THROUGH-LINK").exists()
    for path, data in before.items():
        if path.name != "gradebook.db":
            assert path.read_bytes() == data, path
    assert {p.name for p in (root / "source").iterdir()} == {"x.ipynb"}
    assert (root / "NEW-TOP-LEVEL-ENTRY").exists()  # the course root's folder stays writable (SQLite's journal)
    assert not any(scratch.glob("rlhf-confined-*")), "the confinement's home folder is removed"


@as_root
@needs_bwrap
def test_config_a_confined_run_leaves_in_the_course_root_is_removed(tmp_path, monkeypatch):
    monkeypatch.delenv(confine.ENV_MARK, raising=False)
    root = probe_course(tmp_path / "course")
    cmd, _ = course.confine_if_root([*course.nbgrader_command(), "generate_feedback", "a1"], root)
    stage2 = cmd.index(confine.__file__)
    plant = textwrap.dedent('''
        import os, sys
        root = sys.argv[1]
        open(os.path.join(root, "nbgrader_config.json"), "w").write('{"NbGrader": {"logfile": "/etc/x"}}')
        os.makedirs(os.path.join(root, ".jupyter"))
        os.symlink("/etc/passwd", os.path.join(root, "jupyter_server_config.py"))
        open(os.path.join(root, "grades.csv"), "w").write("kept: the course command writes it\\n")
        os.unlink(os.path.join(root, "planted-link-to-source"))  # the instructor's link, replaced
        os.makedirs(os.path.join(root, "planted-link-to-source", "evil"))
        open(os.path.join(root, "feedback", "zed", "page.html"), "w").write("feedback is this step's output\\n")
        open(os.path.join(root, "autograded", "zed", "swept"), "w").write("planted files are swept out\\n")
        try:
            open(os.path.join(root, "submitted", "zed", "x"), "w")
        except OSError as exc:
            print("submitted:", exc.strerror)
    ''')
    done = subprocess.run(cmd[:stage2 + 5] + [sys.executable, "-c", plant, str(root)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "submitted: Read-only file system" in done.stdout  # feedback never writes submitted/
    for name in ("nbgrader_config.json", ".jupyter", "jupyter_server_config.py"):
        assert not os.path.lexists(root / name), name
        assert f"confinement: removed {root / name}" in done.stderr
    assert (root / "grades.csv").exists() and (root / "feedback" / "zed" / "page.html").exists()
    assert (root / "autograded" / "zed" / "swept").exists()
    link = root / "planted-link-to-source"
    assert link.is_symlink() and os.readlink(link) == str(root / "source" / "PROBE-THROUGH-LINK")
    assert f"confinement: {link} was replaced while grading: the link is put back" in done.stderr
    assert Path("/etc/passwd").exists()


# ------------------------------------------------------------------------------- a real course, as root
PROBE_IN_CONFIG = textwrap.dedent('''

    # --- test_confine: every nbgrader process that grades or writes feedback records what it can write
    import errno as _errno, json as _json, os as _os, sys as _sys
    if any(_a in ("autograde", "generate_feedback") for _a in _sys.argv[1:]):
        def _attempt(_path):
            try:
                _os.close(_os.open(_path, _os.O_WRONLY | _os.O_CREAT | _os.O_APPEND, 0o644))
                return "written"
            except OSError as _exc:
                return _errno.errorcode.get(_exc.errno, str(_exc.errno))
        _record = {"argv": _sys.argv[1:], "pid": _os.getpid(), "marked": _os.environ.get("RLHF_CONFINED"),
                   "writes": {_n: _attempt(_os.path.join(_root, _n)) for _n in
                              ("source/PROBE", "release/PROBE", "nbgrader_config.py", "submitted/zed/PROBE",
                               "autograded/zed/PROBE", "feedback/zed/PROBE", ".cache/jax-compile-seed/PROBE")}}
        with open(_os.path.join(_root, "integrity", "confine-probe-%d.json" % _os.getpid()), "w") as _fh:
            _json.dump(_record, _fh)
''')


def records(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((root / "integrity").glob("confine-probe-*.json"))]


def assert_all_confined(found: list[dict]) -> None:
    assert found, "no nbgrader process recorded anything: the probe did not run"
    for record in found:
        assert record["marked"] == "1", record
        writes = dict(record["writes"])
        if not any(a.startswith("--student") for a in record["argv"]):  # a class-wide step writes every
            for out in confine.STUDENT_DIRS[record["argv"][0]]:         # student's folder it writes at all
                assert writes.pop(f"{out}/zed/PROBE") == "written", record
        assert set(writes.values()) == {"EROFS"}, record


@pytest.fixture(scope="module")
def probed_class(tmp_path_factory):
    """A course copy owned by root with the probe at the end of its config; ada (correct) and ben
    (first notebook only) graded by the course command's class run; zed exists, never graded."""
    if os.geteuid() != 0 or shutil.which("bwrap") is None:
        pytest.skip("confinement applies to root with bubblewrap")
    from course_support import correct_submission, fresh_course, own_db, session_base, write_submissions

    from rlhf_lab.instructor.classrun import pipeline

    saved = dict(os.environ)
    os.environ.pop(confine.ENV_MARK, None)
    root = fresh_course(tmp_path_factory.mktemp("confined") / "course", session_base(tmp_path_factory))
    with open(root / "nbgrader_config.py", "a") as fh:
        fh.write(PROBE_IN_CONFIG)
    for folder in ("integrity", "submitted/zed", "autograded/zed", "feedback/zed"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    a1 = "a1_ppo_objective"
    good = correct_submission(a1)
    first = dict([sorted(good.items())[0]])
    folder = write_submissions(root / "custom_submissions", {"ada": {a1: good}, "ben": {a1: first}})
    run = pipeline.run_class(folder, root=root, db_url=own_db(root), names=[a1], fresh=False, regenerate=False)
    yield root, run, a1, own_db(root)
    os.environ.clear()
    os.environ.update(saved)


def totals(db_url: str, assignment: str) -> dict:
    """``{student: (autograded score, its maximum)}`` of ``assignment`` in the gradebook (the
    written answers wait for a person)."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url, course.COURSE_ID) as gb:
        return {s: (gb.find_submission(assignment, s).code_score, gb.find_submission(assignment, s).max_code_score)
                for s in ("ada", "ben")}


@pytest.mark.slow
def test_the_course_command_grades_confined_and_right(probed_class):
    from rlhf_lab.instructor.classrun import records as run_records

    root, _, a1, db = probed_class
    found = records(root)
    assert_all_confined(found)
    assert {r["argv"][0] for r in found} >= {"autograde"}
    named = {a.split("=", 1)[1] for r in found for a in r["argv"] if a.startswith("--student=")}
    assert {"ada", "ben"} <= named
    (ada, ada_max), (ben, ben_max) = totals(db, a1)["ada"], totals(db, a1)["ben"]
    assert ada == ada_max > 0 and 0 < ben < ben_max
    the_course = course.Course.load(root, db)
    for student in ("ada", "ben"):
        log = Path(run_records.log_path(the_course, a1, student)).read_text(errors="replace")
        assert "(confined: see rlhf_lab.instructor.confine)" in log.splitlines()[1], log[:500]
    assert not list((root / "source").rglob("PROBE")) and not (root / "submitted" / "zed" / "PROBE").exists()


@pytest.mark.slow
def test_bare_nbgrader_as_root_starts_again_confined(probed_class):
    root, _, a1, db = probed_class
    for old in (root / "integrity").glob("confine-probe-*.json"):
        old.unlink()
    env = dict(os.environ, RLHF_COURSE_ROOT=str(root), RLHF_COURSE_DB=db)
    env.pop(confine.ENV_MARK, None)
    nbgrader = str(Path(sys.executable).with_name("nbgrader"))
    for cmd in ([nbgrader, "autograde", a1, "--student=ada", "--force"],
                [sys.executable, "-m", "nbgrader", "generate_feedback", a1, "--student=ada", "--force"]):
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = records(root)
    assert_all_confined(found)
    assert {r["argv"][0] for r in found} == {"autograde", "generate_feedback"}
    assert list((root / "feedback" / "ada" / a1).glob("*.html"))
    assert totals(db, a1)["ada"][0] == totals(db, a1)["ada"][1] > 0


@pytest.mark.slow
def test_formgrader_buttons_as_root_run_confined(probed_class, monkeypatch):
    from nbgrader import converters
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    root, _, a1, db = probed_class
    for old in (root / "integrity").glob("confine-probe-*.json"):
        old.unlink()
    for cls in (converters.Autograde, converters.GenerateFeedback):
        monkeypatch.setattr(cls, "start", cls.start)  # the config patches them in this process: undone after
    monkeypatch.setenv("RLHF_COURSE_ROOT", str(root))
    monkeypatch.setenv("RLHF_COURSE_DB", db)
    monkeypatch.delenv(confine.ENV_MARK, raising=False)
    monkeypatch.chdir(root)
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    assert not records(root), "loading the config in a server process grades nothing"
    api = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
    result = api.autograde(a1, "ben")
    assert result["success"], result
    feedback = api.generate_feedback(a1, "ben")
    assert feedback["success"], feedback
    found = records(root)
    assert_all_confined(found)
    assert {r["argv"][0] for r in found} == {"autograde", "generate_feedback"}
    assert all(r["pid"] != os.getpid() for r in found)
    assert 0 < totals(db, a1)["ben"][0] < totals(db, a1)["ben"][1]


def test_what_the_course_roots_links_point_to_is_read_only_but_never_hides_a_writable_folder(tmp_path):
    root, exchange = tmp_path / "course", tmp_path / "srv-exchange"
    (root / "source").mkdir(parents=True)
    exchange.mkdir()
    for name, target in (("exchange", exchange), ("up", Path("/")), ("parent", tmp_path),
                         ("src", root / "source"), ("out", root / "autograded")):
        (root / name).symlink_to(target)
    (root / "autograded").mkdir()
    args = confine.bind_args(str(root), None, "autograde")
    ro = [args[i + 1] for i, a in enumerate(args) if a == "--ro-bind"]
    rw = [args[i + 1] for i, a in enumerate(args) if a == "--bind"]
    assert str(exchange) in ro  # the instructor's exchange behind a link: read-only
    assert ro.count("/") == 1 and str(tmp_path) not in ro  # a link to a parent would hide the course root
    assert str(root / "source") in ro and str(root / "autograded") not in ro and str(root) in rw
    assert args.index("/") < min(args.index(p) for p in rw)  # / read-only first, the writable folders over it
