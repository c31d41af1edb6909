"""The trusted JAX compilation cache (``rlhf_lab.instructor.grader.compile_cache``).

Fast tests check that a private copy is made only from a seed that verifies (every entry's
SHA-256, this machine, this JAX) and never follows a path out of the seed. The ``slow`` test
autogrades real students with nbgrader: the kernel gets its own copy of the seed, not the seed;
a student who overwrites every cache entry in their kernel leaves the seed intact and the next
student's grades untouched; no private copy outlives its kernel.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from course_support import (  # noqa: F401  (fixtures are used by name)
    LIBRARY_LOG, correct_submission, fresh_course, own_db, replace_cell, session_base, write_submissions,
)
from rlhf_lab.instructor.grader import compile_cache
from rlhf_lab.instructor.classrun import pipeline


def _fake_seed(folder: Path, entries: dict[str, bytes], **key_overrides) -> Path:
    """A seed folder with ``entries`` and a manifest for this machine and JAX (overridable)."""
    import importlib.metadata as md

    folder.mkdir(parents=True)
    for name, data in entries.items():
        (folder / name).write_bytes(data)
    key = {"format": compile_cache.FORMAT, "jax": md.version("jax"), "jaxlib": md.version("jaxlib"),
           "machine": compile_cache.machine_fingerprint(), **key_overrides}
    files = {name: hashlib.sha256(data).hexdigest() for name, data in entries.items()}
    (folder / compile_cache.MANIFEST).write_text(json.dumps({"key": key, "files": files}))
    return folder


ENTRIES = {"jit_a-1-cache": b"first program", "jit_b-2-cache": b"second program"}


def test_private_copy_holds_exactly_the_verified_entries(tmp_path):
    """a verified seed is copied entry by entry into a new folder outside the seed"""
    seed = _fake_seed(tmp_path / "seed", ENTRIES)
    copy = compile_cache.private_copy(seed, tmp_path)
    try:
        assert copy is not None and copy != seed and copy.parent == tmp_path
        assert {p.name: p.read_bytes() for p in copy.iterdir()} == ENTRIES
    finally:
        if copy is not None:
            import shutil
            shutil.rmtree(copy)


@pytest.mark.parametrize("damage", ["changed entry", "missing entry", "other machine", "other jax",
                                    "path out of the seed", "no manifest", "manifest not json"])
def test_private_copy_refuses_a_seed_that_does_not_verify(tmp_path, damage):
    """any mismatch means no cache at all (the kernel compiles), never a wrong cache"""
    overrides = {"other machine": {"machine": "0" * 16}, "other jax": {"jax": "0.0.1"}}.get(damage, {})
    seed = _fake_seed(tmp_path / "seed", ENTRIES, **overrides)
    if damage == "changed entry":
        (seed / "jit_a-1-cache").write_bytes(b"poisoned program")
    elif damage == "missing entry":
        (seed / "jit_b-2-cache").unlink()
    elif damage == "path out of the seed":
        (tmp_path / "outside").write_bytes(b"x")
        manifest = json.loads((seed / compile_cache.MANIFEST).read_text())
        manifest["files"]["../outside"] = hashlib.sha256(b"x").hexdigest()
        (seed / compile_cache.MANIFEST).write_text(json.dumps(manifest))
    elif damage == "no manifest":
        (seed / compile_cache.MANIFEST).unlink()
    elif damage == "manifest not json":
        (seed / compile_cache.MANIFEST).write_text("{not json")
    # a folder of this test's own (kernels of tests running beside it make copies in the system /tmp)
    parent = tmp_path / "copies"
    parent.mkdir()
    assert compile_cache.private_copy(seed, dest_parent=parent) is None
    assert list(parent.iterdir()) == [], "a refused copy left a folder"


def test_a_copy_started_for_a_kernel_exists_at_once_and_is_complete_after_wait(tmp_path):
    """the seed is verified before the copy starts; its entries are written while the kernel starts"""
    seed = _fake_seed(tmp_path / "seed", ENTRIES)
    parent = tmp_path / "copies"
    parent.mkdir()
    copy = compile_cache.start_private_copy(seed, parent)
    assert copy is not None and copy.path.is_dir() and copy.path.parent == parent
    assert copy.wait(30)
    assert {p.name: p.read_bytes() for p in copy.path.iterdir()} == ENTRIES
    assert {oct(p.stat().st_mode & 0o777) for p in copy.path.iterdir()} == {"0o644"}  # readable by the kernel
    copy.remove()
    assert list(parent.iterdir()) == []


def test_links_planted_in_the_copy_folder_redirect_no_write(tmp_path):
    """the kernel may write in its copy while entries arrive: a link at an entry's name or at the
    temporary name it is written under never sends the seed's bytes anywhere else"""
    outside = tmp_path / "outside"
    outside.write_bytes(b"the instructor's file")
    folder = tmp_path / "copy"
    folder.mkdir()
    (folder / "jit_a-1-cache").symlink_to(outside)
    (folder / f".jit_b-2-cache.{os.getpid()}.part").symlink_to(outside)
    copy = compile_cache.PrivateCopy(folder, list(ENTRIES.items()))
    assert copy.wait(30)
    assert outside.read_bytes() == b"the instructor's file"
    entry = folder / "jit_a-1-cache"
    assert not entry.is_symlink() and entry.read_bytes() == ENTRIES["jit_a-1-cache"]  # the link was replaced
    assert not (folder / "jit_b-2-cache").exists()  # skipped: its temporary name was taken
    copy.remove()
    assert not folder.exists() and outside.exists()


def test_a_seed_with_an_entry_in_a_subfolder_is_refused(tmp_path):
    seed = _fake_seed(tmp_path / "seed", ENTRIES)
    (seed / "sub").mkdir()
    (seed / "sub" / "x").write_bytes(b"x")
    manifest = json.loads((seed / compile_cache.MANIFEST).read_text())
    manifest["files"]["sub/x"] = hashlib.sha256(b"x").hexdigest()
    (seed / compile_cache.MANIFEST).write_text(json.dumps(manifest))
    parent = tmp_path / "copies"
    parent.mkdir()
    assert compile_cache.start_private_copy(seed, parent) is None and list(parent.iterdir()) == []


def test_kernel_env_switches_off_the_path_dependent_xla_cache():
    """the cache settings make every compilation cacheable and keys independent of the folder"""
    env = compile_cache.kernel_env("/some/where")
    assert env["JAX_COMPILATION_CACHE_DIR"] == "/some/where"
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert env["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"


PROBE = '''
import json as _json, os as _os, pathlib as _pathlib
_dir = _os.environ.get("JAX_COMPILATION_CACHE_DIR", "")
_entries = [p for p in _pathlib.Path(_dir).iterdir() if p.is_file()] if _dir else []
for _p in _entries:          # a hostile student spoils every cached program it can reach
    _p.write_bytes(b"garbage")
print("CACHE-PROBE " + _json.dumps({"dir": _dir, "entries": len(_entries)}))
'''


@pytest.mark.slow
def test_grading_kernels_get_private_copies_a_student_cannot_spoil(tmp_path, tmp_path_factory, monkeypatch):
    """real autograde: each kernel reads its own copy; spoiling it changes nothing for anyone else"""
    # the graders make their kernels' copies in their temporary folder: a private one here, so that
    # kernels of tests running beside this one (their copies come and go meanwhile) are not counted
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    assignment = "a1_ppo_objective"
    root = fresh_course(tmp_path / "course", session_base(tmp_path_factory))
    seed = compile_cache.seed_dir(root, assignment)
    # the instructor's command, rebuilding: what it prints is meant for a person (on CPUs with
    # AVX-512, XLA logs an error line per cached function each time a kernel reads the cache)
    cli = subprocess.run([sys.executable, "-m", "rlhf_lab.instructor.grader.compile_cache", "--root", str(root),
                          "--force", assignment], capture_output=True, text=True, timeout=600,
                         env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert cli.stdout.startswith(f"{assignment}: built") and not LIBRARY_LOG.search(cli.stdout + cli.stderr), \
        (cli.stdout + cli.stderr)[-3000:]
    t0 = time.perf_counter()
    again = compile_cache.ensure_seed(root, assignment)
    assert again.problem == "" and again.entries > 10, again
    assert not again.rebuilt and time.perf_counter() - t0 < 5, "an unchanged seed must be reused"
    seed_files = {p.name: p.read_bytes() for p in seed.iterdir()}

    good = correct_submission(assignment)
    spoiler = dict(good)
    first = sorted(good)[0]
    nb = good[first]
    answer = next(c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "ppo_surrogate")
    spoiler[first] = replace_cell(nb, "ppo_surrogate", answer.source + "\n" + PROBE)
    subs = write_submissions(tmp_path / "subs", {"a_spoiler": {assignment: spoiler}, "b_next": {assignment: good}})
    pipeline.collect(subs, root, [assignment])
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    # each student's nbgrader process judges by itself (as bare `nbgrader autograde` and Formgrader do),
    # so the second one reads the compiled references the first kept in the grader's own cache
    monkeypatch.setenv("RLHF_JUDGE_SERVER", "0")
    runs = pipeline.autograde(assignment, ["a_spoiler", "b_next"], root, own_db(root))
    assert all(r.ok for r in runs), [r.to_dict() for r in runs]

    graded = nbformat.read(root / "autograded" / "a_spoiler" / assignment / f"{first}.ipynb", as_version=4)
    probe = next(json.loads(line.split(" ", 1)[1]) for c in graded.cells if c.cell_type == "code"
                 for o in c.get("outputs", []) for line in o.get("text", "").splitlines()
                 if line.startswith("CACHE-PROBE "))
    assert probe["dir"], "the grading kernel had no compilation cache"
    assert Path(probe["dir"]).resolve() != seed.resolve() and str(root) not in probe["dir"]
    assert probe["entries"] >= len(seed_files) - 1, "the kernel's copy must hold every seeded program"
    assert not Path(probe["dir"]).exists(), "the kernel's private cache outlived the kernel"
    assert str(private_tmp) in probe["dir"], probe  # the copy was made where the grader was told to
    left = list(private_tmp.glob("rlhf-jax-cache-*"))
    assert not left, f"a private cache was left behind: {left}"
    assert {p.name: p.read_bytes() for p in seed.iterdir()} == seed_files, "the seed changed"

    for path in (root / "autograded").rglob("*.ipynb"):  # kernels that read the cache log nothing either
        assert not LIBRARY_LOG.search(path.read_text(encoding="utf-8")), path
    # the checks' own compiled references are kept for the next grader process, in the course root
    # (which no kernel sees: the probe's kernel found only its private copy, outside the course)
    grader_cache = root / ".cache" / "jax-grader"
    assert grader_cache.is_dir() and list(grader_cache.iterdir()), "the grader kept no compiled references"
    for run in runs:  # and the grader reading them logs nothing either
        assert not LIBRARY_LOG.search(run.log_tail or ""), run.log_tail[-2000:]

    grades = pipeline.read_grades(root, own_db(root))
    tests = [g for g in grades.by_cell("b_next", assignment).values() if g.kind == "test"]
    assert tests and all(g.score == g.max_score for g in tests), \
        [(g.grade_id, g.score, g.max_score) for g in tests]


def test_copies_left_by_a_killed_grader_are_swept_but_fresh_ones_stay(tmp_path):
    """a copy untouched for hours is deleted when the next kernel starts; a recent one is kept"""
    old, recent = tmp_path / "rlhf-jax-cache-old", tmp_path / "rlhf-jax-cache-recent"
    for folder in (old, recent):
        folder.mkdir()
        (folder / "entry").write_bytes(b"x")
    hours_ago = time.time() - compile_cache.STALE_SECONDS - 60
    os.utime(old, (hours_ago, hours_ago))
    assert compile_cache.sweep_stale_copies(tmp_path) == 1
    assert not old.exists() and recent.exists()


SEED_PROBE = '''
import errno, json, os
root = {root!r}
found = {{"uid": os.getuid(), "course files visible": [n for n in ("gradebook.db", "nbgrader_config.py", "source")
                                                      if os.path.exists(os.path.join(root, n))]}}
for name in ("source/PWNED", "nbgrader_config.py", "gradebook.db", "/etc/rlhf-seed-pwned"):
    path = name if name.startswith("/") else os.path.join(root, name)
    try:
        with open(path, "a"):
            pass
        found[name] = "written"
    except OSError as exc:
        found[name] = errno.errorcode[exc.errno]
with open(os.path.join(os.environ["JAX_COMPILATION_CACHE_DIR"], "probe.json"), "w") as fh:
    json.dump(found, fh)
'''


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_the_seed_builder_runs_source_notebooks_in_the_sandbox(tmp_path, monkeypatch):
    """Were ``source/`` ever overwritten (say through a planted link), the seed builder would run the
    attacker's code: it must run where the course's files do not exist and nothing outside the
    seed's cache folder is writable, as an unprivileged id when the grader is root. The probe
    notebook reports from inside through the one folder it may write (the seed keeps the file)."""
    monkeypatch.delenv("RLHF_NO_SANDBOX", raising=False)
    root = tmp_path / "course"
    (root / "source" / "a9_probe").mkdir(parents=True)
    for name in ("nbgrader_config.py", "gradebook.db"):
        (root / name).write_text("# kept\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SEED_PROBE.format(root=str(root)))])
    nbformat.write(nb, root / "source" / "a9_probe" / "01_probe.ipynb")
    result = compile_cache.ensure_seed(root, "a9_probe", force=True)
    assert not result.problem, result.problem
    found = json.loads((result.path / "probe.json").read_text())
    assert found["course files visible"] == [], found
    assert "written" not in {found[k] for k in ("source/PWNED", "nbgrader_config.py", "gradebook.db",
                                                "/etc/rlhf-seed-pwned")}, found
    if os.geteuid() == 0:
        assert found["uid"] != 0, found
    assert not (root / "source" / "PWNED").exists() and not Path("/etc/rlhf-seed-pwned").exists()
    assert (root / "gradebook.db").read_text() == "# kept\n"
