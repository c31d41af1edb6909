#!/usr/bin/env python3
"""Regenerate ``release/`` from ``source/`` with ``nbgrader generate_assignment`` (``make release``).

    .venv/bin/python tools/make_release.py            # lint source/, then rewrite release/ for every assignment
    .venv/bin/python tools/make_release.py --check    # exit 1 if release/ is stale or leaks

Nothing is released while ``source/`` breaks a lint rule (a task heading whose points disagree with
the metadata, say): the problems are printed and the command exits 1. The course's gradebook is never touched (a throwaway one is used), and nbgrader runs with this
interpreter's ``bin`` first on PATH (it shells out to ``alembic``). Then the student build of
``rlhf_lab`` is rebuilt where ``$RLHF_STUDENT_LIB`` says (``rlhf_lab.instructor.operations.student_library``).
"""
import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from rlhf_lab.instructor import authoring  # noqa: E402
from rlhf_lab.instructor.operations import release  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; change nothing")
    parser.add_argument("--root", type=Path, default=ROOT, help="course root (default: this repository)")
    args = parser.parse_args(argv)
    if args.check:
        diff, leaked = release.release_diff(args.root), release.leaks(args.root)
        for d in diff:
            print(f"out of sync with source/: release/{d}")
        for leak in leaked:
            print(f"leak: {leak}")
        if diff or leaked:
            print("release/ is stale or leaks: run tools/make_release.py")
            return 1
        print("release/ is in sync with source/ and holds no instructor-only text")
        return 0
    findings = authoring.lint(args.root)
    if findings:
        for f in findings:
            print(f)
        print(f"{len(findings)} problem(s) in source/: nothing released (fix them, then run this again)")
        return 1
    names = release.make_release(args.root)
    print(f"regenerated release/ for {', '.join(names) or 'no assignment'}")
    leaked = release.leaks(args.root)
    for leak in leaked:
        print(f"leak: {leak}")
    if not leaked:  # the student build of rlhf_lab follows the release ($RLHF_STUDENT_LIB; never fails it)
        from rlhf_lab.instructor.operations import student_library
        print(student_library.release_hook(args.root))
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main())
