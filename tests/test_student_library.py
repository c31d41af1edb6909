"""The student build of rlhf_lab (rlhf_lab/instructor/operations/student_library.py): what a
student's kernel imports on the hub, and what it must not hold."""
from __future__ import annotations

import ast
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from course_support import REPO, correct_submission
from rlhf_lab.instructor.grader import library_build as lb
from rlhf_lab.instructor.operations import student_library as sl

LIBRARY = REPO / "helpers" / "rlhf_lab"
#: Tasks whose reference no released notebook's given code needs: they must be gone.
MUST_BE_GONE = {("trainer", "train"), ("ppo", "reward_kl_frontier"), ("sequences.estimators", "expected_estimates"),
                ("ppo", "exact_reward_gradient"), ("sequences.language", "masked_nll"),
                ("sequences.length_bias", "length_normalised_score"), ("lesson", "run_lesson")}


@pytest.fixture(scope="module")
def student_build():
    """A build where students could reach it (pytest's own tmp folders are 0700)."""
    parent = Path(tempfile.mkdtemp(prefix="student-lib-", dir="/tmp"))
    os.chmod(parent, 0o755)
    try:
        yield sl.build(REPO, parent / "lib")
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _student_env(dest: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(sl.student_env(dest), JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    return env


def _defined(build: Path) -> set[tuple[str, str]]:
    """Every top-level function of the build's files, read from their text (AST), never imported."""
    out = set()
    for path in build.rglob("*.py"):
        rel = path.relative_to(build).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out |= {(".".join(parts), n.name) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return out


def test_the_build_has_no_judging_no_instructor_no_entry_points_and_no_reference_the_notebooks_do_not_need(student_build):
    build = student_build.path
    assert (build / "__init__.py").is_file() and (build / "grading.py").is_file()
    for name in ("judging", "instructor", "demo.py", "lesson_cli.py"):
        assert not (build / name).exists(), name
    defined = _defined(build)
    tasks = {n for names in lb.MANIFEST.values() for n in names}
    present = {f"{m}.{n}".lstrip(".") for m, n in defined if n in tasks}
    record = json.loads((student_build.dest / sl.MARKER).read_text())
    # every task's reference left in the build is one the released notebooks' given code runs,
    # and the build says so (the instructor sees which references students can read)
    assert present == set(record["kept_for_given_code"])
    assert {(m, n) for m, n in defined if n in tasks} <= sl.needed_by(LIBRARY, sl.given_code(REPO, LIBRARY))
    assert not MUST_BE_GONE & defined, MUST_BE_GONE & defined
    assert {".".join(filter(None, p)) for p in MUST_BE_GONE} <= set(record["removed"])


def test_the_build_is_readable_by_everyone_and_writable_by_no_student(student_build):
    dest = student_build.dest
    for folder, dirs, files in os.walk(dest):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o755, folder
        for f in files:
            assert stat.S_IMODE(os.stat(os.path.join(folder, f)).st_mode) == 0o644, f
    spec = json.loads((dest / sl.KERNEL_DIR / "kernel.json").read_text())
    assert spec["env"] == {"PYTHONPATH": str(dest)}
    assert sl.check(dest, REPO) == []


def test_a_student_kernel_imports_the_build_not_the_editable_library_and_cannot_import_judging(student_build):
    dest = student_build.dest
    probe = ("import importlib, json, rlhf_lab\n"
             "from rlhf_lab import grading\n"
             "out = {'file': rlhf_lab.__file__, 'failed': []}\n"
             "for m in ('rlhf_lab.judging', 'rlhf_lab.judging.core', 'rlhf_lab.instructor', 'rlhf_lab.demo'):\n"
             "    try: importlib.import_module(m)\n"
             "    except ImportError: out['failed'].append(m)\n"
             "grading.start()\n"
             "try: grading.judge('test_ppo_loss')\n"
             "except grading.GradingError as e: out['judge'] = str(e)\n"
             "out['has_train'] = hasattr(rlhf_lab, 'train')\n"
             "print(json.dumps(out))\n")
    # the venv's own interpreter, its editable install of the full library active, cwd the repository
    proc = subprocess.run([sys.executable, "-c", probe], env=_student_env(dest), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["file"] == str(student_build.path / "__init__.py")
    assert out["failed"] == ["rlhf_lab.judging", "rlhf_lab.judging.core", "rlhf_lab.instructor", "rlhf_lab.demo"]
    assert "decided by the grader" in out["judge"]
    assert out["has_train"] is False


def test_a_build_students_cannot_reach_is_reported(tmp_path):
    closed = tmp_path / "course"  # like the hub's course root, 0700
    closed.mkdir(mode=0o700)
    made = sl.build(REPO, closed / "student-lib")
    assert made.warnings and str(closed) in made.warnings[0]
    assert any(f"{closed} is mode 700" in p for p in sl.check(closed / "student-lib", REPO))
    assert sl.DEFAULT_DEST == Path("/srv/rlhf-student-lib")


def test_a_build_inside_the_course_root_is_refused(tmp_path):
    with pytest.raises(sl.StudentLibraryError, match="inside the course root"):
        sl.build(REPO, REPO / "student-lib")
    assert not (REPO / "student-lib").exists()


def test_make_release_hook_says_once_why_it_cannot_write_and_does_not_fail(tmp_path, monkeypatch):
    dest = tmp_path / "ro" / "student-lib"
    monkeypatch.setattr(sl.os, "access", lambda path, mode: False)
    message = sl.release_hook(REPO, dest)
    assert "not writable" in message and str(dest) in message and "student_library build" in message
    assert not dest.exists()


def test_check_reports_a_missing_and_a_stale_build(tmp_path, student_build):
    assert "no student build" in sl.check(tmp_path / "nothing", REPO)[0]
    stale = tmp_path / "stale"
    sl.build(REPO, stale)
    record = json.loads((stale / sl.MARKER).read_text())
    os.chmod(stale / sl.MARKER, 0o644)
    (stale / sl.MARKER).write_text(json.dumps({**record, "key": "0" * 24}))
    assert any("stale" in p for p in sl.check(stale, REPO))


def test_the_command_line_builds_and_checks(student_build):
    dest = student_build.dest.parent / "cli"
    cmd = [sys.executable, "-m", "rlhf_lab.instructor.operations.student_library", "build", "--dest", str(dest)]
    made = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=dest.parent)
    assert made.returncode == 0, made.stderr
    assert f"PYTHONPATH={dest}" in made.stdout and "trainer.train" in made.stdout
    checked = subprocess.run([*cmd, "--check"], capture_output=True, text=True, timeout=300, cwd=dest.parent)
    assert checked.returncode == 0 and "current" in checked.stdout, checked.stderr
    assert checked.stderr == ""


def _released():
    return [(p.parent.name, p.stem) for p in sorted((REPO / "release").glob("*/*.ipynb"))]


@pytest.mark.slow
@pytest.mark.parametrize("assignment,notebook", _released(), ids=[f"{a}/{n}" for a, n in _released()])
def test_every_released_notebook_runs_with_correct_answers_in_a_kernel_on_the_student_build(
        student_build, tmp_path, assignment, notebook):
    """The release with the model answers filled in (what a student who solved it has), run from the
    top in a kernel whose rlhf_lab is the student build: no cell may fail (given code, visible tests,
    answers), so the build has everything the released notebooks use."""
    from jupyter_client import KernelManager
    from nbclient import NotebookClient

    nb = correct_submission(assignment)[notebook]
    work = tmp_path / assignment
    work.mkdir()
    for extra in (REPO / "release" / assignment).iterdir():  # data files next to the notebooks
        if extra.suffix != ".ipynb" and extra.is_file():
            (work / extra.name).write_bytes(extra.read_bytes())
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.modules['rlhf_lab'].__file__)"))
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env={**_student_env(student_build.dest), "MPLBACKEND": "Agg"}, cwd=str(work))
    try:
        NotebookClient(nb, km=km, timeout=900, allow_errors=True).execute()
    finally:
        km.shutdown_kernel(now=True)
    errors = [f"cell {i}: {o.ename}: {o.evalue[:300]}" for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    last = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert last.strip() == str(student_build.path / "__init__.py")


def test_grading_starts_in_a_build_without_a_reward_reference(tmp_path):
    """A build without ``fit_reward`` (a2's 02 task; a per-notebook build removes it): the first cell's
    ``grading.start()`` must still run, its trusted copy simply lacking that reference."""
    plan = lb.plan_build(LIBRARY, ("_fit", "fit_reward", "lesson_rewards", "_lesson_rewards_np"))
    assert ("reward", "fit_reward") in plan.removed
    lb.write_build(LIBRARY, tmp_path, plan.removed, plan.modules, lb.GRADER_ONLY)
    probe = ("from rlhf_lab import grading\ngrading.start()\n"
             "print(sorted(n for n in ('fit_reward', 'preference_loss', 'ppo_loss') if hasattr(grading.reference, n)))")
    proc = subprocess.run([sys.executable, "-c", probe], env=_student_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert proc.stdout.split("\n")[-2] == "['ppo_loss', 'preference_loss']"


def test_the_kernel_spec_alone_gives_a_kernel_the_student_build(student_build, tmp_path, monkeypatch):
    """A server with only JUPYTER_PATH=<dest>/share/jupyter (no PYTHONPATH): the notebooks' kernel
    ``python3`` is the build's kernel spec, whose env puts the build first."""
    from jupyter_client import KernelManager

    for var in [v for v in os.environ if v.startswith("PYTHON")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("JUPYTER_PATH", sl.student_env(student_build.dest)["JUPYTER_PATH"])
    km = KernelManager(kernel_name="python3")
    assert km.kernel_spec.resource_dir == str(student_build.dest / sl.KERNEL_DIR)
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        seen = []
        kc.execute_interactive("import rlhf_lab; print(rlhf_lab.__file__)", timeout=120,
                               output_hook=lambda msg: seen.append(msg["content"].get("text", "")))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert "".join(seen).strip() == str(student_build.path / "__init__.py")
