#!/usr/bin/env python3
"""Regenerate the bundled example class ``examples/submissions/<student>/<assignment>/*.ipynb``.

    .venv/bin/python tools/make_examples.py            # rewrite examples/submissions/
    .venv/bin/python tools/make_examples.py --check    # exit 1 if the committed copy is stale

Built deterministically from ``release/`` (run tools/make_release.py first), the solutions in
``source/`` (matched by nbgrader grade_id) and the mistake recipes in ``examples/mistakes/*.py``:
``ada_correct`` (everything solved), ``ben_unchanged`` (the release as handed out), one student per
mistake recipe (correct except that one cell, in the recipe's assignment) and a noisy-but-correct
student whose functions print harmless warnings to stderr (must still get full points).
"""
import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_PLATFORMS", "cpu")

sys.path.insert(0, str(ROOT / "tests"))  # the fixtures package (example and hostile submissions)
from fixtures import submissions  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; change nothing")
    parser.add_argument("--root", type=Path, default=ROOT, help="course root (default: this repository)")
    args = parser.parse_args(argv)
    if args.check:
        diff = submissions.examples_diff(args.root)
        for d in diff:
            print(f"stale: examples/submissions/{d}")
        print("examples/submissions/ is " + ("STALE: run tools/make_examples.py" if diff else "in sync"))
        return 1 if diff else 0
    ex = submissions.write_examples(args.root)
    print(f"wrote {len(ex.files)} notebooks to examples/submissions/")
    print(f"  {ex.correct}: every solution filled in")
    print(f"  {ex.unchanged}: the release unchanged")
    for sid, m in ex.mistakes.items():
        print(f"  {sid}: {m.assignment}/{m.notebook} cell {m.grade_id} replaced; must fail {', '.join(m.fails)}")
    print(f"  {ex.noisy}: correct, with harmless stderr warnings on every call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
