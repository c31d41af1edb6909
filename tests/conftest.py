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

#: Test modules that grade the session's two big classes (the bundled class, once per session, and
#: the hostile class): one group, so that in ``make test``'s slow part (two processes,
#: ``-n 2 --dist loadscope``) each class is graded once and the two class runs, each on two Dask
#: workers, never compete with each other for the machine's cores.
CLASS_RUN_MODULES = {"test_feedback_check", "test_pipeline", "test_trust"}


def scope_of(nodeid: str) -> str:
    """The group a test runs in: its module (so module- and session-scoped fixtures are built once
    per process), or ``class-runs`` for the modules of :data:`CLASS_RUN_MODULES`."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return "class-runs" if module in CLASS_RUN_MODULES else module


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` sends each :func:`scope_of` group to one process as a whole.

    (pytest-xdist's own ``loadgroup`` reads groups from suffixes it writes into the test ids, which
    pytest 9.2's structured ids no longer carry: pytest-xdist issue 1386. A scheduler that computes
    the group from the test id does not depend on that.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class CourseGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return CourseGroups(config, log)
