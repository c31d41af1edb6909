#!/usr/bin/env python3
"""Regenerate the hostile and broken submissions ``examples/hostile/`` (and ``CASES.json``).

    .venv/bin/python tools/make_hostile.py            # rewrite examples/hostile/
    .venv/bin/python tools/make_hostile.py --check    # exit 1 if the committed copy is stale

Built deterministically from ``release/`` and the solutions in ``source/`` (run
tools/make_release.py first). Each case, its attack and the treatment the grader owes it are
defined in ``tests/fixtures/hostile.py``; ``tools/trust_report.py`` grades them.
"""
import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_PLATFORMS", "cpu")

sys.path.insert(0, str(ROOT / "tests"))  # the fixtures package (example and hostile submissions)
from fixtures import hostile  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; change nothing")
    parser.add_argument("--root", type=Path, default=ROOT, help="course root (default: this repository)")
    args = parser.parse_args(argv)
    if args.check:
        diff = hostile.cases_diff(args.root)
        for d in diff:
            print(f"stale: examples/hostile/{d}")
        print("examples/hostile/ is " + ("STALE: run tools/make_hostile.py" if diff else "in sync"))
        return 1 if diff else 0
    cases = hostile.write_cases(args.root)
    print(f"wrote {len(cases)} cases to examples/hostile/")
    for c in cases:
        print(f"  {c.student:<32} {c.title}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
