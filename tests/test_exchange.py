"""The course-local nbgrader exchange: where it is, how it is created, and the real loop on the real
course (release -> two students fetch and submit through nbgrader -> collect -> pre-flight)."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from course_support import REPO, course_template_dir, fresh_course, own_db, session_base  # noqa: F401
from rlhf_lab.instructor.operations import exchange
from rlhf_lab.instructor.grader import integrity
from rlhf_lab.instructor.classrun import pipeline

A = "a1_ppo_objective"
STUDENT_CONFIG = REPO / "jupyter" / "student"


# ------------------------------------------------------------------------------------ fast checks
def test_config_points_nbgrader_at_the_course_exchange_and_one_variable_moves_it(tmp_path, monkeypatch):
    monkeypatch.delenv("RLHF_EXCHANGE", raising=False)
    cfg = exchange.course_config(REPO)
    assert Path(cfg.Exchange.root) == REPO / "exchange" == exchange.exchange_root(REPO)
    assert cfg.Exchange.root != "/usr/local/share/nbgrader/exchange"
    monkeypatch.setenv("RLHF_EXCHANGE", str(tmp_path / "shared"))
    assert Path(exchange.course_config(REPO).Exchange.root) == tmp_path / "shared" == exchange.exchange_root(REPO)


def test_students_config_uses_the_same_exchange_and_course(monkeypatch, tmp_path):
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.delenv("RLHF_EXCHANGE", raising=False)
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(STUDENT_CONFIG)).load_config()
    assert Path(cfg.Exchange.root) == REPO / "exchange" and cfg.CourseDirectory.course_id == pipeline.COURSE_ID
    monkeypatch.setenv("RLHF_EXCHANGE", str(tmp_path))
    monkeypatch.setenv("RLHF_STUDENT_ID", "ada_correct")
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(STUDENT_CONFIG)).load_config()
    assert Path(cfg.Exchange.root) == tmp_path and cfg.CourseDirectory.student_id == "ada_correct"


def test_init_creates_the_exchange_world_writable_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        path = exchange.ensure_exchange(path=tmp_path / "course" / "exchange")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o777  # what nbgrader's release_assignment checks
    path.chmod(0o755)
    assert stat.S_IMODE(exchange.ensure_exchange(path=path).stat().st_mode) == 0o777


def test_init_refuses_system_folders_unless_asked(tmp_path):
    system = Path("/usr/local/share/nbgrader/exchange")
    existed = system.exists()
    with pytest.raises(exchange.ExchangeError, match="refusing to use the system folder"):
        exchange.ensure_exchange(path=system)
    assert system.exists() == existed  # nothing was created
    for p in ("/", "/var/tmp/x", "/srv/exchange", "/etc"):
        assert exchange.is_system_path(p), p
    assert not exchange.is_system_path(tmp_path / "exchange")
    (tmp_path / "file").write_text("x")
    with pytest.raises(exchange.ExchangeError, match="not a folder"):
        exchange.ensure_exchange(path=tmp_path / "file")
    with pytest.raises(TypeError, match="allow_system"):
        exchange.ensure_exchange(path=tmp_path / "e", allow_system="yes")


def test_init_command_prints_where_the_exchange_is(tmp_path, capsys):
    assert exchange.main(["init", "--path", str(tmp_path / "ex")]) == 0
    assert f"exchange ready: {tmp_path / 'ex'}" in capsys.readouterr().out
    assert exchange.main(["init", "--path", "/usr/share/nbgrader-exchange-test"]) == 2
    assert "refusing" in capsys.readouterr().err


def test_student_ids_nbgrader_cannot_store_are_refused_before_nbgrader_runs(tmp_path):
    with pytest.raises(ValueError, match="contains '\\+' or '\\*'"):
        exchange.submit_as(A, "ada+1", tmp_path)
    with pytest.raises(ValueError, match="assignment must be a non-empty name"):
        exchange.release("../x")
    with pytest.raises(exchange.ExchangeError, match="nothing to submit"):
        exchange.submit_as(A, "ada", tmp_path)


def test_preflight_treats_nbgrader_exchange_files_as_nbgrader_s(tmp_path):
    root = pipeline.copy_course(tmp_path / "c", REPO, include=("nbgrader_config.py", "release", "examples"))
    for sid, extra in (("ada_correct", {"timestamp.txt": "2026-12-01 08:00:00.000000 UTC",
                                        "submission_secret.txt": "ab" * 64}),
                       ("ben_unchanged", {"timestamp.txt": "x" * 5000, "notes.txt": "mine"})):
        dest = root / "submitted" / sid / A
        shutil.copytree(REPO / "examples" / "submissions" / sid / A, dest)
        for name, text in extra.items():
            (dest / name).write_text(text)
    report = integrity.preflight(A, root, write=False)
    extras = {(f.student, f.notebook) for f in report.findings if f.code == "extra-file"}
    assert ("ada_correct", "timestamp.txt") not in extras and ("ada_correct", "submission_secret.txt") not in extras
    # a student's own file is still reported, and so is an implausibly large "timestamp"
    assert {("ben_unchanged", "notes.txt"), ("ben_unchanged", "timestamp.txt")} <= extras


# --------------------------------------------------------------------- the loop on the real course
@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    """Release -> two students fetch, edit, submit (nbgrader submit --student) -> collect."""
    base = session_base(tmp_path_factory)
    root = fresh_course(tmp_path_factory.mktemp("exchange") / "course", base)
    db = own_db(root)
    ex = exchange.ensure_exchange(path=root / "exchange")
    out = {"root": root, "db": db, "exchange": ex, "release": exchange.release(A, root, db, ex)}
    homes = {}
    for sid in ("ada_correct", "cy_dropped_signed_min"):
        home = root.parent / "homes" / sid
        out[f"fetch {sid}"] = exchange.fetch(A, home, root, ex)
        fetched = sorted(p.name for p in (home / A).glob("*.ipynb"))
        out[f"fetched {sid}"] = fetched
        for nb in fetched:  # the student's work: their answers in the fetched notebooks
            shutil.copy(REPO / "examples" / "submissions" / sid / A / nb, home / A / nb)
        out[f"submit {sid}"] = exchange.submit_as(A, sid, home, root, ex)
        homes[sid] = home
    # a student whose folder nbgrader cannot submit fails alone, named; the others are submitted
    (root.parent / "homes" / "dee_kl_direction_reversed").mkdir(parents=True)
    shutil.copytree(REPO / "examples" / "submissions" / "eve_hard_coded_table" / A, root.parent / "homes" / "eve" / A)
    out["many"] = exchange.submit_many(A, {"dee_kl_direction_reversed": root.parent / "homes" / "dee_kl_direction_reversed",
                                           "eve_hard_coded_table": root.parent / "homes" / "eve"}, root, ex)
    out["inbound"] = exchange.inbound(A, root, ex)
    out["collect"] = exchange.collect(A, root, db, ex, check_owner=False)
    out["homes"] = homes
    return out


@pytest.mark.slow
def test_release_puts_the_release_into_the_course_exchange_only(loop):
    root, ex = loop["root"], loop["exchange"]
    outbound = ex / pipeline.COURSE_ID / "outbound" / A
    assert sorted(p.name for p in outbound.glob("*.ipynb")) == sorted(p.name for p in (root / "release" / A).glob("*.ipynb"))
    assert "Released as: rlhf-ppo a1_ppo_objective" in loop["release"].output
    assert "WARNING" not in loop["release"].output  # no permission fix-ups, no system folder created
    assert stat.S_IMODE((ex / pipeline.COURSE_ID / "inbound").stat().st_mode) & 0o733 == 0o733


@pytest.mark.slow
def test_students_fetch_exactly_the_release(loop):
    for sid in loop["homes"]:
        assert loop[f"fetched {sid}"] == sorted(p.name for p in (REPO / "release" / A).glob("*.ipynb"))
        assert "Fetched as: rlhf-ppo a1_ppo_objective" in loop[f"fetch {sid}"].output


@pytest.mark.slow
def test_each_submission_is_filed_under_its_student(loop):
    owners = sorted(name.split("+")[0] for name in loop["inbound"])
    assert owners == ["ada_correct", "cy_dropped_signed_min", "eve_hard_coded_table"]
    assert loop["many"]["eve_hard_coded_table"] is None
    assert loop["many"]["dee_kl_direction_reversed"].startswith("student dee_kl_direction_reversed: nbgrader submit failed")
    for name in loop["inbound"]:
        files = sorted(p.name for p in (loop["exchange"] / pipeline.COURSE_ID / "inbound" / name).iterdir())
        assert {"timestamp.txt", "submission_secret.txt"} <= set(files)
    for sid in loop["homes"]:
        assert f"Submitted as: rlhf-ppo a1_ppo_objective" in loop[f"submit {sid}"].output


@pytest.mark.slow
def test_collect_brings_each_student_s_latest_work_into_submitted(loop):
    root = loop["root"]
    assert sorted(p.name for p in (root / "submitted").iterdir()) == \
        ["ada_correct", "cy_dropped_signed_min", "eve_hard_coded_table"]
    for sid in loop["homes"]:
        dest = root / "submitted" / sid / A
        for nb in (REPO / "examples" / "submissions" / sid / A).glob("*.ipynb"):
            assert (dest / nb.name).read_bytes() == nb.read_bytes(), (sid, nb.name)
        assert (dest / "timestamp.txt").read_text().endswith("UTC")
    assert "Collecting submission: ada_correct a1_ppo_objective" in loop["collect"].output
    assert "cheating attempt" not in loop["collect"].output
    # the pre-flight of a real exchange submission has nothing to say about nbgrader's own files
    report = integrity.preflight(A, root, write=False)
    assert [f for f in report.findings if f.code == "extra-file"] == []


def test_demo_refuses_a_system_exchange_before_touching_the_course(tmp_path, monkeypatch, capsys):
    from rlhf_lab import demo

    root = pipeline.copy_course(tmp_path / "c", REPO, include=("nbgrader_config.py", "examples"))
    (root / "gradebook.db").write_text("an earlier run's gradebook")
    monkeypatch.setenv("RLHF_COURSE_ROOT", str(root))
    monkeypatch.setenv("RLHF_EXCHANGE", "/usr/share/rlhf-demo-exchange-test")
    assert demo.main(["--in-place"]) == 2  # in place: the course's own exchange ($RLHF_EXCHANGE)
    assert "refusing to use the system folder /usr/share/rlhf-demo-exchange-test" in capsys.readouterr().err
    assert not Path("/usr/share/rlhf-demo-exchange-test").exists()
    assert (root / "gradebook.db").read_text() == "an earlier run's gradebook"  # nothing was cleaned


def test_grading_what_collect_brought_never_starts_by_deleting_it():
    with pytest.raises(ValueError, match="would delete what nbgrader collect put in submitted/"):
        pipeline.run_class(None, root=REPO, fresh=True)
