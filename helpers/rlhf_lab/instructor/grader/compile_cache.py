"""A trusted JAX compilation cache, seeded once per assignment and copied privately into every kernel.

Every notebook an autograder runs starts a fresh kernel, and every fresh kernel compiles the same
XLA programs again: the given cells, the library's reference functions and the hidden tests'
trusted procedures have the same shapes for every student. On this course that is about 300
compilations per ``a2_ppo_rlhf`` submission, a third of its grading time.

This module removes that cost without letting one student's kernel touch another's:

* :func:`ensure_seed` runs the assignment's **source** notebooks (the instructor's solutions,
  trusted code) once with JAX's persistent compilation cache switched on, in the grading sandbox
  (:class:`.sandbox.SandboxedKernelManager`: were ``source/`` ever overwritten, that code would
  otherwise run as the grader; its kernels see the course read-only through nothing but their
  scratch copy of the notebooks, and write only that scratch and the cache being built), and keeps the cache
  entries in ``<course root>/.cache/jax-compile-seed/<assignment>/`` with a ``MANIFEST.json``
  that records the SHA-256 of every entry and a key: the source notebooks, the course library,
  the JAX version and this machine's CPU. A seed whose key no longer matches is rebuilt; an
  unchanged one is reused (the check costs milliseconds).
* :func:`start_private_copy`, called by the kernel launcher (:mod:`.kernel_guard`) for each kernel
  verifies every entry of the seed of the notebook's
  assignment against the manifest and copies the seed into a new temporary folder, writing it while
  the kernel starts (:class:`PrivateCopy`), and :func:`kernel_env` points the kernel's JAX at it. The kernel
  reads and writes only its own copy, which is deleted when the kernel stops; nothing it writes
  reaches the seed or the next student. A missing, stale or damaged seed means no cache (the
  kernel compiles as before), never a wrong one.

Only regular files of the built cache become seed entries (links, FIFOs and the like a kernel
left there are ignored). With ``RLHF_NO_SANDBOX=1`` the seed kernels run unsandboxed, like every
grading kernel then (a warning says so).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SEED_DIR = Path(".cache") / "jax-compile-seed"
MANIFEST = "MANIFEST.json"
FORMAT = 1
#: JAX settings that make every compilation land in the cache (by default only slow ones do).
CACHE_SETTINGS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    # XLA logs C++ lines on cache reads: a warning on every one ("Assume version compatibility"),
    # and on CPUs with AVX-512 an ERROR per entry as well ("Target machine feature
    # +prefer-no-gather is not supported on the host machine", jax-ml/jax#38445,
    # openxla/xla#44565: the loader takes two LLVM tuning flags for instruction sets; the entry
    # still loads and runs). In a kernel they land in cell outputs and on the instructor's terminal,
    # once per cached function. Level 3 keeps only fatal lines; a real failure is still a Python
    # exception in the notebook.
    "TF_CPP_MIN_LOG_LEVEL": "3",
    # By default JAX also points XLA's GPU autotuning cache into the cache folder, and that path
    # becomes part of every cache key: a copy in another folder would never hit. Not used on CPU.
    "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none",
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def machine_fingerprint() -> str:
    """The CPU an XLA:CPU executable was compiled for: architecture plus the CPU feature flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    except OSError:
        pass
    return hashlib.sha256(f"{platform.machine()}|{flags}".encode()).hexdigest()[:16]


def seed_key(root: Path, assignment: str) -> dict:
    """What a seed depends on; a seed is used only while all of it is unchanged."""
    import jax
    import jaxlib

    import rlhf_lab

    library = Path(rlhf_lab.__file__).parent
    lib_hash = hashlib.sha256()
    for path in sorted(library.glob("*.py")):
        lib_hash.update(path.name.encode() + _sha256(path).encode())
    notebooks = {p.name: _sha256(p) for p in sorted((root / "source" / assignment).glob("*.ipynb"))}
    return {"format": FORMAT, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "machine": machine_fingerprint(), "library": lib_hash.hexdigest(), "notebooks": notebooks}


def _course_module(filename: str, name: str):
    """A module of this folder loaded as ``nbgrader_config.py`` loads it (one module object per process)."""
    import importlib.util
    import sys

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(filename))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _sandbox():
    """:mod:`.sandbox` (its kernel manager runs the seed kernels)."""
    return _course_module("sandbox.py", "rlhf_lab_course_sandbox")


def regular_files(folder: Path) -> list[Path]:
    """The regular files under ``folder``, links not followed (nothing else can be a cache entry)."""
    import stat

    found = []
    for current, dirs, files in os.walk(folder):  # os.walk does not descend into linked folders
        for name in sorted(files):
            path = Path(current) / name
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    found.append(path)
            except OSError:
                continue
    return sorted(found)


def seed_dir(root: str | os.PathLike, assignment: str) -> Path:
    return Path(root) / SEED_DIR / assignment


def _read_manifest(folder: Path) -> dict | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None


@dataclass
class SeedResult:
    assignment: str
    path: Path
    entries: int
    seconds: float
    rebuilt: bool
    problem: str = ""   # why no seed could be built (the pipeline then grades without one)


def kernel_env(cache_dir: str | os.PathLike) -> dict:
    """Environment variables that point a kernel's JAX at ``cache_dir`` and cache every compilation."""
    return {"JAX_COMPILATION_CACHE_DIR": str(cache_dir), **CACHE_SETTINGS}


def ensure_seed(root: str | os.PathLike, assignment: str, *, force: bool = False,
                timeout: int = 300) -> SeedResult:
    """Build (or reuse) the seed of ``assignment`` by running its source notebooks once.

    The notebooks run with nbclient in a copy of ``source/<assignment>/`` (so the source folder is
    never touched), with ``NBGRADER_EXECUTION=autograde`` as in autograding, each in the grading
    sandbox with the full course library build (``library_build="full"``: the instructor's
    solutions may call anything). A notebook that fails is reported in ``problem`` and no seed is
    kept: a seed must come from a clean run.
    """
    import nbformat
    from nbclient import NotebookClient

    root = Path(root).resolve()
    folder = seed_dir(root, assignment)
    key = seed_key(root, assignment)
    manifest = _read_manifest(folder)
    if not force and manifest is not None and manifest.get("key") == key:
        return SeedResult(assignment, folder, len(manifest["files"]), 0.0, rebuilt=False)

    t0 = time.perf_counter()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"seed-{assignment}-", dir=folder.parent) as tmp:
        tmp = Path(tmp)
        # the folder is named after the assignment: the sandbox picks the library build by it
        cache, work = tmp / "cache", tmp / "work" / assignment
        shutil.copytree(root / "source" / assignment, work, symlinks=True)
        cache.mkdir()
        # the kernels start as grading kernels do (same sandbox, limits and environment); the
        # launcher points their JAX cache at `cache`, the one folder they may write besides their scratch
        manager = _sandbox().SandboxedKernelManager
        env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "PYTEST_CURRENT_TEST")}
        # (the launcher adds kernel_env(cache), CACHE_SETTINGS' log level included)
        env.update(NBGRADER_EXECUTION="autograde", JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
        for path in sorted(work.glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            try:
                # the kernel's own start-up warnings (ipykernel: "running over TCP without
                # encryption") would land on the instructor's terminal, once per notebook
                client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                        kernel_manager_class=manager,
                                        extra_arguments=["--IPKernelApp.log_level=ERROR"],
                                        resources={"metadata": {"path": str(work)}})
                km = manager(kernel_name="python3", seed_cache_dir=str(cache), course_root=str(root),
                             library_build="full", notebook_name=path.stem, compile_cache_root="")
                client.km = km  # (nbclient drops its own reference when the run ends)
                try:
                    client.execute(env=env)
                finally:  # also when the kernel died, which skips the manager's own cleanup
                    km.release_sandbox()
            except Exception as exc:  # noqa: BLE001 - any failure means: no seed
                return SeedResult(assignment, folder, 0, time.perf_counter() - t0, rebuilt=False,
                                  problem=f"{path.name} did not run cleanly: {type(exc).__name__}: "
                                          f"{str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}")
        entries = regular_files(cache)
        files = {p.relative_to(cache).as_posix(): _sha256(p) for p in entries}
        staged = tmp / "staged"
        staged.mkdir()
        for path in entries:
            target = staged / path.relative_to(cache)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target, follow_symlinks=False)
        (staged / MANIFEST).write_text(json.dumps({"key": key, "files": files}, indent=1, sort_keys=True) + "\n")
        old = folder.with_name(folder.name + ".old")
        if folder.exists():
            folder.rename(old)
        staged.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    return SeedResult(assignment, folder, len(files), time.perf_counter() - t0, rebuilt=True)


def private_copy(seed: str | os.PathLike, dest_parent: str | os.PathLike | None = None) -> Path | None:
    """A fresh temporary copy of the seed folder ``seed``, verified entry by entry; None if unusable.

    Unusable: no manifest, a key for another machine or JAX version, an entry missing or whose
    SHA-256 differs from the manifest, an entry name that is not a plain file name. The caller owns
    the returned folder and deletes it. (:func:`start_private_copy` without waiting for the writes.)
    """
    copy = start_private_copy(seed, dest_parent)
    if copy is None:
        return None
    copy.wait()
    return copy.path


class PrivateCopy:
    """A private copy of a seed whose verified entries are still being written (a daemon thread).

    :attr:`path` exists from the start (mode 0700, empty): a kernel can be pointed at it at once, and
    its start-up overlaps the writes (writing a few hundred small files takes 0.2-0.4 s on a busy
    disk, verifying them about 0.01 s). Each entry appears whole (written under a temporary name,
    then renamed), opened relative to the folder with ``O_NOFOLLOW | O_EXCL``, so nothing created in
    the folder meanwhile (the kernel may write there) redirects a write; an entry JAX has not found
    yet is compiled by the kernel itself, as without a cache. Entries are 0644: the kernel reads
    them, and writes only new ones. :meth:`remove` waits for the writer, then deletes the folder."""

    def __init__(self, path: Path, entries: list[tuple[str, bytes]]):
        self.path = path
        self._thread = threading.Thread(target=_write_entries, args=(path, entries), daemon=True,
                                        name="compile-cache-copy")
        self._thread.start()

    def __fspath__(self) -> str:
        return str(self.path)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the writes; True when they are done."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def remove(self) -> None:
        self.wait()
        shutil.rmtree(self.path, ignore_errors=True)


def _write_entries(folder: Path, entries: list[tuple[str, bytes]]) -> None:
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for name, data in entries:
            part = f".{name}.{os.getpid()}.part"
            try:
                fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=dfd)
            except OSError:
                continue
            try:
                os.fchmod(fd, 0o644)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError:
                os.close(fd)
                _unlink_quietly(part, dfd)
                continue
            os.close(fd)
            try:
                os.rename(part, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError:
                _unlink_quietly(part, dfd)
    finally:
        os.close(dfd)


def _unlink_quietly(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass


def _plain_name(rel: str) -> bool:
    return bool(rel) and "/" not in rel and "\\" not in rel and not rel.startswith(".") and "\0" not in rel


def start_private_copy(seed: str | os.PathLike, dest_parent: str | os.PathLike | None = None) -> PrivateCopy | None:
    """Verify the seed ``seed`` entry by entry now (what :func:`private_copy` refuses, this refuses:
    None), then write the copy in the background (:class:`PrivateCopy`). The caller owns the copy
    and calls :meth:`PrivateCopy.remove`."""
    seed = Path(seed)
    manifest = _read_manifest(seed)
    if manifest is None:
        return None
    key = manifest.get("key") or {}
    try:
        import importlib.metadata as md
        current = {"jax": md.version("jax"), "jaxlib": md.version("jaxlib")}
    except Exception:  # noqa: BLE001
        return None
    if key.get("machine") != machine_fingerprint() or key.get("jax") != current["jax"] \
            or key.get("jaxlib") != current["jaxlib"] or key.get("format") != FORMAT:
        return None
    entries: list[tuple[str, bytes]] = []
    try:
        for rel, digest in manifest["files"].items():
            src = seed / rel
            if not _plain_name(rel) or src.is_symlink():
                return None
            data = src.read_bytes()
            if hashlib.sha256(data).hexdigest() != digest:
                return None
            entries.append((rel, data))
    except (OSError, ValueError, TypeError):
        return None
    sweep_stale_copies(dest_parent)
    return PrivateCopy(Path(tempfile.mkdtemp(prefix="rlhf-jax-cache-", dir=dest_parent)), entries)


STALE_SECONDS = 6 * 3600


def sweep_stale_copies(parent: str | os.PathLike | None = None, older_than: float = STALE_SECONDS) -> int:
    """Delete private copies left by graders that were killed (no cleanup ran); returns how many.

    Only folders untouched for ``older_than`` seconds go: no grading kernel lives that long (every
    cell has a timeout), so a copy in use is never removed."""
    parent = Path(parent or tempfile.gettempdir())
    removed = 0
    now = time.time()
    for folder in parent.glob("rlhf-jax-cache-*"):
        try:
            if folder.is_dir() and not folder.is_symlink() and now - folder.stat().st_mtime > older_than:
                shutil.rmtree(folder, ignore_errors=True)
                removed += 1
        except OSError:
            continue
    return removed


def seed_for_notebook_dir(root: str | os.PathLike, notebook_dir: str | os.PathLike) -> Path:
    """The seed folder for a kernel started in ``notebook_dir`` (``.../<assignment>/``)."""
    return seed_dir(root, Path(notebook_dir).name)


def main(argv=None) -> int:
    """``python -m rlhf_lab.instructor.grader.compile_cache [--root R] [--force] [ASSIGNMENT ...]``."""
    import argparse

    from ..course import course_root, graded_assignments

    ap = argparse.ArgumentParser(description="Build the trusted JAX compilation cache seeds of the course.")
    ap.add_argument("assignments", nargs="*")
    ap.add_argument("--root")
    ap.add_argument("--force", action="store_true", help="rebuild even if the seed is up to date")
    args = ap.parse_args(argv)
    root = course_root(args.root)
    status = 0
    for name in args.assignments or graded_assignments(root):
        r = ensure_seed(root, name, force=args.force)
        if r.problem:
            status = 1
            print(f"{name}: no seed ({r.problem})")
        else:
            print(f"{name}: {'built' if r.rebuilt else 'up to date'}, {r.entries} entries, {r.seconds:.1f} s -> {r.path}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
