"""Suite-wide settings. Expensive course fixtures live in course_support.py (session scope)."""
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MPLBACKEND", "Agg")
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
# nbgrader shells out to bare `alembic`/`jupyter`: the interpreter's bin must come first on PATH.
_bin = str(Path(sys.executable).parent)
if not os.environ.get("PATH", "").startswith(_bin + os.pathsep):
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")
