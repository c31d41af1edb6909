"""Suite-wide settings. Expensive course fixtures live in course_support.py (session scope)."""
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MPLBACKEND", "Agg")
# `make release` (tools/make_release.py) rebuilds the students' copy of the library where this says;
# the suite's releases write it into a folder of their own, never the machine's /srv/rlhf-student-lib
if "RLHF_STUDENT_LIB" not in os.environ:
    import tempfile
    os.environ["RLHF_STUDENT_LIB"] = os.path.join(tempfile.mkdtemp(prefix="rlhf-student-lib-"), "lib")
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
# nbgrader shells out to bare `alembic`/`jupyter`: the interpreter's bin must come first on PATH.
_bin = str(Path(sys.executable).parent)
if not os.environ.get("PATH", "").startswith(_bin + os.pathsep):
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")

#: Test modules that grade the session's bundled class (once per session, ``bundled_class_run``):
#: one group, so that in ``make test``'s slow part (``-n 2 --dist loadscope``) it is graded once.
BUNDLED_CLASS_MODULES = {"test_feedback_check", "test_pipeline"}
#: Tests of other modules that use the bundled class too (they join its group).
BUNDLED_CLASS_TESTS = {"test_class_graded_again_killed_partway_and_resumed_gives_identical_grades"}
#: Modules whose tests share no expensive fixture: each test is its own group, so the two
#: processes share them out evenly (the 100-seed runs of every check would otherwise fill one).
SPREAD_MODULES = {"test_alternative_answers"}


def scope_of(nodeid: str) -> str:
    """The group a test runs in: ``bundled-class`` for the tests of the bundled class, the test itself
    for :data:`SPREAD_MODULES`, else its module (so module- and session-scoped fixtures are built once
    per process; the hostile class of ``test_trust`` is one module fixture)."""
    path, _, test = nodeid.partition("::")
    module = path.rsplit("/", 1)[-1].removesuffix(".py")
    if module in BUNDLED_CLASS_MODULES or test.split("[", 1)[0] in BUNDLED_CLASS_TESTS:
        return "bundled-class"
    if module in SPREAD_MODULES:
        return nodeid
    return module


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
