#!/usr/bin/env bash
# Create or refresh .venv from the pinned requirements. Reuses it when the pins and the project
# metadata are unchanged (content hash, not timestamps, so a fresh clone behaves predictably).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
PY=${PYTHON:-python3}
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
have=$(cat "$VENV/.pins-sha256" 2>/dev/null || true)
if [ -x "$VENV/bin/python" ] && [ "$want" = "$have" ]; then
  exit 0
fi
echo "bootstrap: building $VENV from requirements.txt" >&2
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade-strategy only-if-needed -r requirements.txt
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
echo "$want" > "$VENV/.pins-sha256"
