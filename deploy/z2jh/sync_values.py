"""Copy the hub config snippets into ``hub.extraConfig`` of ``deploy/z2jh/values.yaml``.

    .venv/bin/python deploy/z2jh/sync_values.py          # rewrite the blocks
    .venv/bin/python deploy/z2jh/sync_values.py --check  # exit 1 when a block differs from its file

Helm reads only values, so each snippet's text is in values.yaml as a literal block; the files in
``deploy/`` are the ones the tests execute. ``tests/test_deploy_configs.py`` fails when they differ.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEPLOY = HERE.parent
VALUES = HERE / "values.yaml"
#: hub.extraConfig key -> the file whose text it holds (JupyterHub runs them in key order)
SNIPPETS = {
    "10-rlhf-groups": DEPLOY / "hub" / "rlhf_groups.py",
    "20-rlhf-lti": DEPLOY / "lti" / "jupyterhub_config_lti.py",
    "30-rlhf-k8s": DEPLOY / "z2jh" / "rlhf_k8s.py",
}


def block(text: str) -> str:
    return "".join(("      " + line) if line.strip() else "\n" for line in text.splitlines(keepends=True))


def synced(values: str) -> str:
    for key, path in SNIPPETS.items():
        pattern = re.compile(rf"^(    {re.escape(key)}: \|\n)((?:      .*\n|\n)*)", re.M)
        if not pattern.search(values):
            raise SystemExit(f"{VALUES}: no `    {key}: |` block under hub.extraConfig")
        values = pattern.sub(lambda m: m.group(1) + block(path.read_text(encoding="utf-8")), values, count=1)
    return values


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    old = VALUES.read_text(encoding="utf-8")
    new = synced(old)
    if "--check" in argv:
        if new != old:
            print(f"{VALUES} is out of date: run .venv/bin/python deploy/z2jh/sync_values.py", file=sys.stderr)
            return 1
        return 0
    if new != old:
        VALUES.write_text(new, encoding="utf-8")
        print(f"updated {VALUES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
