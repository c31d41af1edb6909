"""The student build of ``rlhf_lab``: the library a student's kernel imports, one per release.

A student's kernel must run every released notebook (its given code, its visible tests, a correct
answer) and must not hand a student what they must not read: ``judging/`` (every hidden check and
its diagnoses), ``instructor/``, the command-line entry points (``demo.py``, ``lesson_cli.py``) and
the reference implementation of a task that is open. The build is made with the per-notebook
builds' own machinery (:mod:`..grader.library_build`: :func:`plan_build`, :func:`write_build`,
:func:`verify_build`): the definitions are physically absent from the files.

**Which tasks are "open".** Every task of every assignment of the course (the union of
:data:`~..grader.library_build.MANIFEST`), released or not, due or past due. A build is not remade
when a deadline passes, late work and extensions keep earlier tasks open for some students, and a
task of an assignment not yet released is open too (its notebook will be). The only definitions
kept are the ones a student's kernel cannot do without: those the released notebooks' given code
and visible tests use (directly, through other library functions, through module-level code such
as a table of estimators, or as ``grading.reference.<name>``, the visible tests' trusted copy).
Those are listed in ``STUDENT_BUILD.json`` and printed by the command, so the instructor sees which
references a student can read; grading never relies on their absence here, because a grading
kernel gets its own per-notebook build without the functions that notebook asks for (a later
assignment's given code is built in its own notebook there), and delegating to them fails there.

``grading.py`` goes into the build as it is: ``grading.start()`` (which binds
``grading.reference``) and ``grading.judge()``, none of the hidden tests' logic, which lives in
``judging/``. Without ``judging/``, ``grading.judge()`` says the grader decides, outside the kernel.

**Where.** ``$RLHF_STUDENT_LIB``, else ``/srv/rlhf-student-lib`` (:data:`DEFAULT_DEST`): a folder
every student can read and none can write (folders 0755, files 0644, owned by whoever builds it:
root or the instructor), outside the course root, which is 0700 on the hub (the hub's course root is
``/srv/rlhf-course``, so the build cannot live under it: every folder above the build must be
searchable by others, and :func:`check` says which one is not). It holds::

    <dest>/rlhf_lab/                         the build
    <dest>/STUDENT_BUILD.json                what was removed and kept, and the plan's hash
    <dest>/share/jupyter/kernels/python3/    a kernel spec with env PYTHONPATH=<dest>

**How a student's kernel imports it.** The student's server sets ``PYTHONPATH=<dest>`` (and,
optionally, ``JUPYTER_PATH=<dest>/share/jupyter`` for the kernel spec, which sets it again for the
kernel alone). The course venv has the full library installed editable, but as a path entry
(``__editable__.rlhf_lab-*.pth`` appends ``<repo>/helpers`` to ``sys.path``, after
``site-packages``), and ``PYTHONPATH`` entries come before it, so ``import rlhf_lab`` finds the
build, and ``rlhf_lab.judging`` / ``rlhf_lab.instructor`` are looked up in the build's folder only
and fail. ``--check`` proves it in a fresh interpreter of this venv with that environment (an
editable install with a meta-path finder would win over ``PYTHONPATH``; the check would then fail,
and a separate student venv would be the fix). The repository's checkout stays readable on disk
(``<repo>/helpers``): keeping it out of students' reach is the hub's job (mode of the course root).

Command line::

    python -m rlhf_lab.instructor.operations.student_library build [--dest DIR] [--root DIR]
    python -m rlhf_lab.instructor.operations.student_library build --check [--dest DIR]

``make release`` rebuilds it (:func:`release_hook`) when the destination is writable, and says
once why not otherwise.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..course import course_root
from ..grader import library_build as lb

ENV_VAR = "RLHF_STUDENT_LIB"
DEFAULT_DEST = Path("/srv/rlhf-student-lib")
MARKER = "STUDENT_BUILD.json"
KERNEL_DIR = Path("share") / "jupyter" / "kernels" / "python3"
#: Modules ``grading.reference`` is a private copy of (its names come from these).
REFERENCE_MODULES = ("ppo", "reward")


class StudentLibraryError(RuntimeError):
    """The student build cannot be made or used as asked."""


def default_dest() -> Path:
    """``$RLHF_STUDENT_LIB``, else :data:`DEFAULT_DEST`."""
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser().absolute() if env else DEFAULT_DEST


def released_notebooks(root=None) -> list[Path]:
    """The student versions of every assignment: ``<root>/release/*/*.ipynb``."""
    return sorted((course_root(root) / "release").glob("*/*.ipynb"))


def reference_readings(notebook) -> set[tuple[str, str]]:
    """``(module, name)`` for every ``grading.reference.<name>`` in the given (non-answer) code:
    the visible tests' trusted copy of a reference, loaded from the build's ``ppo.py``/``reward.py``."""
    import ast

    found: set[str] = set()
    for cell in lb._cells(notebook):
        if cell.get("cell_type") != "code" or lb._nbgrader(cell).get("solution"):
            continue
        try:
            tree = ast.parse(lb._strip_magics(lb._source(cell)))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            chain = lb._dotted(node) if isinstance(node, ast.Attribute) else None
            if chain and len(chain) >= 3 and chain[-3:-1] == ["grading", "reference"]:
                found.add(chain[-1])
    return {(m, n) for n in found for m in REFERENCE_MODULES}


def given_code(root=None, library_dir=None) -> set[tuple[str, str]]:
    """What the released notebooks' given code and visible tests use: ``(module, name)`` pairs."""
    library_dir = Path(library_dir or lb._installed_library())
    modules = lb._module_files(library_dir)
    functions = lb.library_functions(library_dir)
    used: set[tuple[str, str]] = set()
    for nb in released_notebooks(root):
        used |= {p for p in lb.given_names(nb) if p[0] in modules}
        used |= {p for p in reference_readings(nb) if p in functions}
    return used


def local_imports(library_dir) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """Top-level function or class -> library names it imports inside its body (``from .reward
    import fit_reward`` in a function), which :func:`~..grader.library_build.dependency_graph`
    reads only at module level."""
    import ast

    trees = lb._modules(Path(library_dir))
    out: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for module, tree in trees.items():
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for sub in ast.walk(node):
                if not (isinstance(sub, ast.ImportFrom) and sub.level >= 1 and sub.module):
                    continue
                base = lb._relative_base(module, sub.level, trees)
                if base is None:
                    continue
                target = lb._join(base, sub.module)
                for alias in sub.names:
                    out.setdefault((module, node.name), set()).add(lb._resolve((target, alias.name), trees))
    return out


def needed_by(library_dir, given) -> set[tuple[str, str]]:
    """``given`` and every definition it reaches, through module-level and function-local imports."""
    library_dir = Path(library_dir)
    trees = lb._modules(library_dir)
    edges, roots = lb.dependency_graph(library_dir)
    merged = {k: set(v) for k, v in edges.items()}
    for k, v in local_imports(library_dir).items():
        merged.setdefault(k, set()).update(v)
    start = {lb._resolve(p, trees) for p in given} | set().union(*roots.values())
    return lb._closure(start, merged)


def plan(root=None, library_dir=None, manifest=None) -> tuple[lb.BuildPlan, set]:
    """(the build plan, the given code it serves): every task's reference removed (see the module
    docstring), except what the released notebooks' given code needs (its closure, local imports
    included, is what the plan keeps)."""
    library_dir = Path(library_dir or lb._installed_library())
    manifest = lb.MANIFEST if manifest is None else manifest
    names = sorted({n for v in manifest.values() for n in v})
    given = given_code(root, library_dir)
    functions = set(lb.dependency_graph(library_dir)[0])
    reached = {p for p in needed_by(library_dir, given) if p in functions}
    return lb.plan_build(library_dir, names, given | reached), given | reached


def kept_definitions(library_dir, build_plan: lb.BuildPlan) -> list[str]:
    """``module.name`` of every definition of a task's name that the build keeps (given code needs it)."""
    kept = set(build_plan.kept_for_given_code)
    removed = set(build_plan.removed)
    return sorted(".".join(filter(None, p)) for p in lb.library_functions(Path(library_dir))
                  if p[1] in kept and p[0] in build_plan.modules and p not in removed)


def plan_hash(library_dir, build_plan: lb.BuildPlan) -> str:
    return lb.build_hash(library_dir, build_plan.removed, (*build_plan.modules, "-judging", "student"))


@dataclass
class StudentBuild:
    dest: Path
    plan: lb.BuildPlan
    key: str
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.dest / "rlhf_lab"


def student_env(dest=None) -> dict[str, str]:
    """What a student's server (hub spawner, ``student_lab``) sets so its kernels import the build."""
    dest = Path(dest) if dest is not None else default_dest()
    return {"PYTHONPATH": str(dest), "JUPYTER_PATH": str(dest / KERNEL_DIR.parent.parent)}


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def unreachable(dest: Path) -> Path | None:
    """The first folder at or above ``dest`` that other users cannot enter (None: all can)."""
    for folder in [Path(dest), *Path(dest).parents]:
        if folder.exists() and not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def _kernel_spec(dest: Path) -> dict:
    return {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (ipykernel)", "language": "python",
            "env": {"PYTHONPATH": str(dest)}, "metadata": {"debugger": True}}


def _make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each 0755 (whatever the umask)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        p.mkdir()
        os.chmod(p, 0o755)


def build(root=None, dest=None, library_dir=None, manifest=None) -> StudentBuild:
    """Write and verify the student build into ``dest`` (default :func:`default_dest`), replacing
    the one there only once the new one verified. Raises :class:`StudentLibraryError`."""
    root = course_root(root)
    dest = Path(dest).absolute() if dest is not None else default_dest()
    library_dir = Path(library_dir or lb._installed_library()).resolve()
    if _inside(dest, root):
        raise StudentLibraryError(f"{dest} is inside the course root {root}: students cannot read it there "
                                  f"on a hub (the course root is 0700); choose another --dest or ${ENV_VAR}")
    build_plan, given = plan(root, library_dir, manifest)
    key = plan_hash(library_dir, build_plan)
    try:
        _make_dirs(dest)
    except OSError as exc:
        raise StudentLibraryError(f"cannot create {dest}: {exc.strerror}") from None
    try:
        staging = Path(tempfile.mkdtemp(prefix=".student-build-", dir=dest))
    except OSError as exc:
        raise StudentLibraryError(f"cannot write into {dest}: {exc.strerror}") from None
    old = None
    try:
        lb.write_build(library_dir, staging, build_plan.removed, build_plan.modules, lb.GRADER_ONLY)
        problems = lb.verify_build(staging, build_plan.removed, sorted(given))
        if problems:
            raise StudentLibraryError("the student build is unusable: " + "; ".join(problems))
        for folder, _, files in os.walk(staging / "rlhf_lab"):  # (the check left bytecode, made under the umask)
            os.chmod(folder, 0o755)
            for f in files:
                os.chmod(os.path.join(folder, f), 0o644)
        target = dest / "rlhf_lab"
        if target.exists():
            old = dest / f".old-{os.getpid()}"
            target.rename(old)
        (staging / "rlhf_lab").rename(target)
        record = {"format": 1, "key": key, "library": str(library_dir), "course_root": str(root),
                  "released_notebooks": [str(p.relative_to(root)) for p in released_notebooks(root)],
                  "removed": [".".join(filter(None, p)) for p in build_plan.removed],
                  "kept_for_given_code": kept_definitions(library_dir, build_plan)}
        (dest / MARKER).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        kernel = dest / KERNEL_DIR
        _make_dirs(kernel)
        (kernel / "kernel.json").write_text(json.dumps(_kernel_spec(dest), indent=1) + "\n", encoding="utf-8")
        for path in (dest / MARKER, kernel / "kernel.json"):
            os.chmod(path, 0o644)
        os.chmod(dest, 0o755)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    notes = [f"kept {n}: the released notebooks' given code needs it" for n in kept_definitions(library_dir, build_plan)]
    made = StudentBuild(dest, build_plan, key, notes)
    closed = unreachable(dest)
    if closed is not None:
        made.warnings.append(f"students cannot reach it: {closed} is not searchable by others")
    return made


_PROBE = r"""
import importlib, json, sys
out = {"file": None, "missing": {}}
import rlhf_lab
out["file"] = rlhf_lab.__file__
for name in ("rlhf_lab.judging", "rlhf_lab.instructor", "rlhf_lab.demo", "rlhf_lab.lesson_cli"):
    try:
        importlib.import_module(name)
    except ImportError as exc:
        out["missing"][name] = type(exc).__name__
from rlhf_lab import grading
grading.start()
try:
    grading.judge("x")
    out["judge"] = "returned"
except grading.GradingError as exc:
    out["judge"] = str(exc)
print(json.dumps(out))
"""


def check(dest=None, root=None, library_dir=None, python: str | None = None) -> list[str]:
    """Problems of the build at ``dest`` (empty: good and current). A fresh interpreter of this venv
    (the editable full library installed) with :func:`student_env` must import ``rlhf_lab`` from
    the build and fail to import ``judging``/``instructor``; the build must match the current plan
    (library and released notebooks) and no file or folder may be writable by group or others."""
    dest = Path(dest).absolute() if dest is not None else default_dest()
    problems: list[str] = []
    marker = dest / MARKER
    if not (dest / "rlhf_lab" / "__init__.py").is_file() or not marker.is_file():
        return [f"no student build at {dest} (python -m rlhf_lab.instructor.operations.student_library build)"]
    library_dir = Path(library_dir or lb._installed_library()).resolve()
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except ValueError:
        record = {}
    if root is None and record.get("course_root") and Path(record["course_root"]).is_dir():
        root = record["course_root"]  # the course whose release/ it was built for
    build_plan, _ = plan(root, library_dir)
    if record.get("key") != plan_hash(library_dir, build_plan):
        problems.append(f"the student build at {dest} is stale (the library or release/ changed): rebuild it")
    for sub in ("judging", "instructor", "demo.py", "lesson_cli.py"):
        if (dest / "rlhf_lab" / sub).exists():
            problems.append(f"the student build holds rlhf_lab/{sub}")
    for folder, dirs, files in os.walk(dest):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            if os.lstat(name).st_mode & 0o022:
                problems.append(f"{name} is writable by group or others")
    closed = unreachable(dest)
    if closed is not None:
        problems.append(f"students cannot reach the build: {closed} is mode {stat.S_IMODE(os.stat(closed).st_mode):o} "
                        "(others may not enter it); put the build elsewhere")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
    env.update(student_env(dest), JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([python or sys.executable, "-c", _PROBE], env=env, cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return problems + [f"a student's interpreter cannot use the build: {tail}"]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not str(out["file"]).startswith(str(dest / "rlhf_lab")):
        problems.append(f"with PYTHONPATH={dest}, rlhf_lab is imported from {out['file']}, not from the build "
                        "(an import hook of the full library wins): give students a venv of their own")
    for name in ("rlhf_lab.judging", "rlhf_lab.instructor"):
        if name not in out["missing"]:
            problems.append(f"a student's kernel can import {name}")
    if "grader" not in str(out.get("judge")):
        problems.append(f"grading.judge() in a student's kernel: {out.get('judge')}")
    return problems


def release_hook(root=None, dest=None) -> str:
    """For ``make release``: rebuild the student build if ``dest`` can be written, else say why not.
    Never raises (a release without root must not fail on a system folder)."""
    dest = Path(dest).absolute() if dest is not None else default_dest()
    probe = dest
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        return (f"student library: {dest} is not writable by this user, so it was not rebuilt; as its owner "
                f"(root or the instructor) run: {Path(sys.executable)} -m rlhf_lab.instructor.operations."
                f"student_library build --dest {dest}   (or set ${ENV_VAR} to a folder students can read)")
    try:
        made = build(root, dest)
    except Exception as exc:  # noqa: BLE001 (the release itself is done; say why the build is not)
        return f"student library: not rebuilt: {type(exc).__name__}: {exc}"
    return (f"student library: rebuilt {made.path} ({len(made.plan.removed)} reference definitions removed, "
            f"{len(made.notes)} kept for given code); student servers set PYTHONPATH={dest}"
            + "".join(f"; warning: {w}" for w in made.warnings))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.instructor.operations.student_library",
                                     description="Build (or check) the student build of rlhf_lab.")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the student build (or, with --check, check it)")
    b.add_argument("--dest", type=Path, help=f"folder to hold rlhf_lab (default ${ENV_VAR}, else {DEFAULT_DEST})")
    b.add_argument("--root", type=Path, help="course root (default: $RLHF_COURSE_ROOT or this repository)")
    b.add_argument("--check", action="store_true", help="only check the build there; change nothing")
    args = parser.parse_args(argv)
    dest = args.dest.absolute() if args.dest else default_dest()
    if args.check:
        problems = check(dest, args.root)
        for p in problems:
            print(f"student library: {p}", file=sys.stderr)
        if not problems:
            print(f"student library at {dest}: current; a kernel with PYTHONPATH={dest} imports it and "
                  "cannot import rlhf_lab.judging or rlhf_lab.instructor")
        return 1 if problems else 0
    try:
        made = build(args.root, dest)
    except StudentLibraryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"student library: {made.path}")
    print(f"  removed {len(made.plan.removed)} reference definitions: "
          + ", ".join(".".join(filter(None, p)) for p in made.plan.removed))
    kept = [n.removeprefix("kept ").split(":")[0] for n in made.notes]
    if kept:
        print(f"  kept {len(kept)} (the released notebooks' given code needs them, so students can read them): "
              + ", ".join(kept))
    print(f"  student servers set PYTHONPATH={dest} (kernel spec: JUPYTER_PATH={dest / 'share' / 'jupyter'})")
    for w in made.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
