"""nbgrader configuration of the course ``rlhf-ppo``.

The course root is the folder holding this file (override with ``RLHF_COURSE_ROOT``), and the
gradebook is the SQLite file ``<root>/gradebook.db`` (override with ``RLHF_COURSE_DB``, for
example ``postgresql://user@127.0.0.1:5432/grades``). Both overrides exist so tests, the demo's
``--workdir`` and the parallel grader can run the real pipeline on a copy of the course.

What this file makes robust, and why:

* **stderr never costs points.** nbgrader gives a test cell zero points as soon as it wrote
  anything to stderr (``nbgrader.utils.determine_grade``). A correct answer can trigger a harmless
  ``UserWarning`` from JAX or matplotlib, so the autograde pipeline gets one extra step right after
  execution, :class:`rlhf_lab.instructor.grader.preprocessors.StderrToStdout`, which relabels every stderr
  stream as stdout (each line prefixed ``[stderr]`` so the feedback still shows it). Exceptions,
  failed asserts, timeouts and dead kernels are ``error`` outputs, never stderr, so a failing test
  still scores zero. The kernel environment below also removes the usual sources of noise.
* **Per-cell timeout.** A cell that runs longer than ``RLHF_CELL_TIMEOUT`` seconds (default 60)
  is interrupted and recorded as a ``CellTimeoutError``; the rest of the notebook still runs, so
  the student is graded on what finished.
* **No silent output loss.** After a cell's reply nbgrader waits ``iopub_timeout`` seconds for its
  outputs and fails the notebook rather than grading incomplete outputs; the wait is generous so a
  busy machine (parallel grading) does not fail good submissions.

nbgrader only *warns* when a config file fails to load, so the instructor pipeline
(:mod:`rlhf_lab.instructor`) checks that this file loaded with these settings before it grades.
"""
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_root = os.path.abspath(os.environ.get("RLHF_COURSE_ROOT") or _here)
_db = os.environ.get("RLHF_COURSE_DB") or "sqlite:///" + os.path.join(_root, "gradebook.db")
_cell_timeout = int(os.environ.get("RLHF_CELL_TIMEOUT", "60"))

# The kernels nbgrader starts inherit this process's environment. JAX_PLATFORMS=cpu stops JAX from
# probing for accelerators (and warning that none was found); TF_CPP_MIN_LOG_LEVEL silences XLA's
# C++ INFO/WARNING log lines, which would otherwise land on the cell's stderr.
for _name, _value in {
    "JAX_PLATFORMS": "cpu",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
}.items():
    os.environ.setdefault(_name, _value)
# A non-interactive MPLBACKEND (test runners often export Agg) would stop ipykernel from choosing its
# inline backend, and every plt.show() would warn on stderr: let the kernel pick its own backend.
os.environ.pop("MPLBACKEND", None)
# nbgrader shells out to the bare `alembic` and `jupyter` commands: use the ones next to this Python.
_bin = os.path.dirname(sys.executable)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _bin:
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")

# The judge imports JAX in this process, and every kernel and sandbox is then started
# with subprocess, whose fork is followed at once by exec: JAX's "os.fork() was called ... deadlock"
# RuntimeWarning is about forks that go on running Python, not these, and would only alarm the instructor.
import warnings  # noqa: E402

warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
# nbgrader's gradebook adds a new student's submission through a relationship SQLAlchemy 2 warns about
# ("Object of type <SubmittedAssignment> not in session, add operation along 'Student.submissions' will
# not proceed") on every first autograde of a student; the rows are written all the same.
warnings.filterwarnings("ignore", message=r"Object of type <Submitted\w+> not in session", module=r"nbgrader\.api")

c = get_config()  # noqa: F821 (provided by traitlets when it executes this file)

c.CourseDirectory.course_id = "rlhf-ppo"
c.CourseDirectory.root = _root
c.CourseDirectory.db_url = _db
# Never copy caches or checkpoints into release/ or autograded/.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".DS_Store"]

# --- execution (autograde and validate) --------------------------------------------------------
c.Execute.timeout = _cell_timeout
c.Execute.interrupt_on_timeout = True
c.Execute.startup_timeout = 120
c.Execute.iopub_timeout = 30
c.Execute.raise_on_iopub_timeout = True
c.Execute.execute_retries = 0
# The kernel's state is thrown away after the last cell: kill it instead of a graceful shutdown
# handshake (about 0.5 s saved per notebook, that is per notebook of every student).
c.Execute.shutdown_kernel = "immediate"

# --- autograde: relabel stderr right after execution (see the module docstring) ----------------
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties, CheckCellMetadata, Execute, IgnorePattern, LimitOutput, SaveAutoGrades,
)


def _course_preprocessors():
    """Load ``rlhf_lab/instructor/grader/preprocessors.py`` by its file path.

    ``import rlhf_lab.instructor.grader.preprocessors`` would first run the helper library's package
    ``__init__``, which imports JAX: about a second of start-up in every nbgrader process, that is,
    per autograded student. The module itself needs only nbgrader and traitlets.
    """
    import importlib.util

    spec = importlib.util.find_spec("rlhf_lab")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the course's helper library rlhf_lab is not installed in this environment")
    path = os.path.join(list(spec.submodule_search_locations)[0], "instructor", "grader", "preprocessors.py")
    name = "rlhf_lab_course_preprocessors"
    if name not in sys.modules:
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    return sys.modules[name]


StderrToStdout = _course_preprocessors().StderrToStdout

c.Autograde.autograde_preprocessors = [
    Execute,
    StderrToStdout,
    IgnorePattern,
    ClearMetadataPreprocessor,
    LimitOutput,
    SaveAutoGrades,
    AssignLatePenalties,
    CheckCellMetadata,
]

# The marker lets the pipeline prove this file was loaded by the nbgrader process it started.
c.StderrToStdout.prefix = "[stderr] "

# --- trust: kernel limits, a kernel death never costs the rest, feedback without hidden tests -----
# (docs/security.md and rlhf_lab/instructor/grader/{kernel_guard,feedback_filter}.py)
# * Execute is replaced by rlhf_lab's drop-in subclass of the same name (every c.Execute.* setting
#   above still applies): kernels start under RLIMIT_AS = $RLHF_KERNEL_MEMORY_MB MiB (default 4096)
#   and RLIMIT_FSIZE = $RLHF_KERNEL_FILE_MB MiB (default 1024), in the sandbox (sandbox.py), and a
#   kernel that dies (os._exit, crash, memory) or ignores the timeout's interrupt is killed, the
#   cells after it are marked not run, and the student is graded on what finished.
# * generate_feedback drops hidden-test code and traceback context from the feedback HTML
#   (nbgrader issue #1363) but keeps each failure's message.
# Both modules are loaded by file path, like StderrToStdout, so nbgrader never imports JAX.
def _course_module(filename, name):
    import importlib.util

    spec = importlib.util.find_spec("rlhf_lab")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the course's helper library rlhf_lab is not installed in this environment")
    if name not in sys.modules:
        path = os.path.join(list(spec.submodule_search_locations)[0], "instructor", *filename.split("/"))
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    return sys.modules[name]


# Run as root on a root-owned course, grading and feedback never run with root's power
# (rlhf_lab/instructor/confine.py): the machine read-only except autograded/, feedback/, integrity/,
# .cache/ and the gradebook, uid 0 without the machine's capabilities. `nbgrader autograde` and
# `nbgrader generate_feedback` typed by hand start again in that confinement before doing anything,
# and Formgrader's Autograde and Generate Feedback buttons run their step as such a subprocess. The
# course's commands confine their own nbgrader runs. As any other account, nothing changes.
_confine = _course_module("confine.py", "rlhf_lab_course_confine")
_confine.reexec_if_needed(_root, db_url=_db)
_confine.confine_formgrader(_db)

_kernel_guard = _course_module("grader/kernel_guard.py", "rlhf_lab_course_kernel_guard")
# Every grading kernel runs in a bubblewrap sandbox (docs/sandbox.md): own PID namespace, no network,
# only its notebook folder writable, the notebook's library build read-only. Without bwrap grading
# refuses; RLHF_NO_SANDBOX=1 grades unprotected, with a warning.
_sandbox = _course_module("grader/sandbox.py", "rlhf_lab_course_sandbox")
# (autograding only: the judged Execute below passes this manager explicitly; `nbgrader validate` of a
# student's own notebook, or of the instructor's source, runs unsandboxed as nbgrader always did)
c.SandboxedKernelManager.course_root = _root
# Each kernel gets a private, verified copy of its assignment's trusted JAX compilation cache (built
# from the source notebooks by `python -m rlhf_lab.instructor.grader.compile_cache`, which the pipeline runs
# before autograding); RLHF_COMPILE_CACHE=0 switches it off. See rlhf_lab/instructor/grader/compile_cache.py.
if os.environ.get("RLHF_COMPILE_CACHE", "1") != "0":
    c.LimitedKernelManager.compile_cache_root = _root
# Hidden tests are decided by the judge, in this process (rlhf_lab/instructor/grader/judge.py): a test cell
# whose hidden region is grading.judge("<grade_id>") is not run in the kernel; the check registered
# under that grade id draws fresh inputs here, asks the kernel for the outputs of the student's
# functions (plain data only), computes the expected values with this process's library and sets
# the cell's outputs to the verdict. Every way of autograding (nbgrader autograde, Formgrader's
# button, the course's commands, Dask) reads this file, so every one of them grades this way.
_judge = _course_module("grader/judge.py", "rlhf_lab_course_judge")
# The checks' compiled references are kept for the next grader process in .cache/jax-grader/ (the
# grader's own folder: kernels never see the course root); RLHF_COMPILE_CACHE=0 switches it off too.
_judge.use_compile_cache(_root)


def _sandboxed_init(self, *args, **kwargs):
    kwargs.setdefault("kernel_manager_class", _sandbox.SandboxedKernelManager)
    _kernel_guard.Execute.__init__(self, *args, **kwargs)


_JudgedExecute = type("Execute", (_judge.JudgeCells, _kernel_guard.Execute),
                      {"__module__": _kernel_guard.__name__, "__init__": _sandboxed_init})
c.Autograde.autograde_preprocessors = [
    _JudgedExecute if p is Execute else p for p in c.Autograde.autograde_preprocessors
]
# Student HTML never runs in a grader's browser (rlhf_lab/instructor/grader/html_safety.py): the LAST step
# sanitises the notebook nbgrader writes to autograded/ (Formgrader and JupyterLab read it). Last,
# after SaveAutoGrades: grades are decided on the notebook as it ran (a markdown answer's checksum,
# a test's outputs), and the sanitiser changes no output type, stream, error or cell metadata.
_html_safety = _course_module("grader/html_safety.py", "rlhf_lab_course_html_safety")
c.Autograde.autograde_preprocessors = list(c.Autograde.autograde_preprocessors) + [_html_safety.SanitizeNotebook]
# The integrity pre-flight of the submitted files (rlhf_lab/instructor/grader/integrity.py) and its withheld
# points run inside every autograde, through nbgrader's convert hooks: before a submission is
# converted, the pre-flight checks its folder, quarantines what must not run and removes it from the
# list nbgrader grades; after nbgrader saved the auto scores, the points of blocked cells are
# withheld (manual score 0, notebook flagged, reason in the comment). `nbgrader autograde`,
# Formgrader's Autograde button, the course's commands and the Dask workers all read this file, so
# the same files get the same grade on every path (rlhf_lab/instructor/grader/preflight_hook.py).
_preflight = _course_module("grader/preflight_hook.py", "rlhf_lab_course_preflight_hook").hooks(_root, _db)
c.Autograde.pre_convert_hook = _preflight.pre
c.Autograde.post_convert_hook = _preflight.post
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor  # noqa: E402
from nbgrader.preprocessors import GetGrades  # noqa: E402

c.GenerateFeedback.preprocessors = [
    GetGrades,
    _course_module("grader/feedback_filter.py", "rlhf_lab_course_feedback_filter").HideHiddenTests,
    CSSHTMLHeaderPreprocessor,
]

# --- autograde: a locked cell left as released is not "changed" (rlhf_lab/instructor/grader/released_cells.py)
# nbgrader compares each submitted locked cell with the gradebook's text, hidden tests included, so it
# warned "Attribute 'checksum' for cell test_... has changed!" for every untouched test cell (nbgrader
# issue #1961). The course's OverwriteCells compares it with the text the release gave the student; a
# real edit is still reported and restored by nbgrader.
from nbgrader.converters.autograde import Autograde as _AutogradeConverter  # noqa: E402
from nbgrader.preprocessors import OverwriteCells as _NbgraderOverwriteCells  # noqa: E402

_released_cells = _course_module("grader/released_cells.py", "rlhf_lab_course_released_cells")
_sanitize_steps = (list(c.Autograde.sanitize_preprocessors) if "sanitize_preprocessors" in c.Autograde
                   else list(_AutogradeConverter.class_traits()["sanitize_preprocessors"].default()))
c.Autograde.sanitize_preprocessors = [_released_cells.OverwriteCells if p is _NbgraderOverwriteCells else p
                                      for p in _sanitize_steps]

# --- distribution: the course-local exchange and LMS downloads (release/fetch/submit/collect) ---
# (added for running a class; see rlhf_lab/instructor/operations/{exchange,lms}.py and README "Instructors")
# * The exchange is a folder of the course, <root>/exchange, or wherever $RLHF_EXCHANGE points
#   (one variable: a shared disk on a multi-user machine). It is never nbgrader's system default
#   (/usr/local/share/nbgrader/exchange), which `nbgrader release_assignment` run as root would
#   silently create. `python -m rlhf_lab.instructor.operations.exchange init` (make exchange) creates it with
#   the permissions nbgrader checks (drwxrwxrwx), so nbgrader never has to change them.
# * `nbgrader zip_collect ASSIGNMENT` reads the LMS download from downloaded/ASSIGNMENT/archive/
#   and recognises Canvas's and Moodle's file naming (course collector plugin, roster lookup).
_exchange = os.path.abspath(os.environ.get("RLHF_EXCHANGE") or os.path.join(_root, "exchange"))
c.Exchange.root = _exchange
c.Exchange.path_includes_course = False
_lms = _course_module("operations/lms.py", "rlhf_lab_course_lms")
c.ZipCollectApp.collector_plugin = _lms.LmsFileNameCollector
c.ZipCollectApp.extractor_plugin = _lms.SafeExtractor
c.LmsFileNameCollector.roster = os.environ.get("RLHF_ROSTER") or _lms.default_roster(_root)
# * `nbgrader export` writes grades.csv with a real CSV writer, as UTF-8: a student folder named
#   with a comma, a quote or a newline stays one row with the same columns.
c.ExportApp.plugin_class = _course_module("operations/csv_export.py", "rlhf_lab_course_csv_export").CsvExport
c.LmsFileNameCollector.released = sorted({
    _name for _a in (os.listdir(os.path.join(_root, "release")) if os.path.isdir(os.path.join(_root, "release")) else [])
    if os.path.isdir(os.path.join(_root, "release", _a))
    for _name in os.listdir(os.path.join(_root, "release", _a)) if _name.endswith(".ipynb")
})
# * Feedback for an answer still waiting for a human says "awaiting grading", not 0: a course
#   preprocessor marks those cells and two filters let the text through nbgrader's own template.
#   The pipeline also holds such notebooks back by default (see rlhf_lab.instructor.classrun.pipeline.feedback).
_feedback_filter = _course_module("grader/feedback_filter.py", "rlhf_lab_course_feedback_filter")
if _feedback_filter.MarkPendingGrades not in c.GenerateFeedback.preprocessors:
    c.GenerateFeedback.preprocessors = list(c.GenerateFeedback.preprocessors) + [_feedback_filter.MarkPendingGrades]
c.HTMLExporter.filters = {"float": _feedback_filter.float_filter, "round": _feedback_filter.round_filter}
# * Student HTML never runs (rlhf_lab/instructor/grader/html_safety.py). Every HTML page the course renders
#   (Formgrader's submission view, feedback) sanitises the notebook again as its first preprocessor,
#   also for notebooks autograded before this existed, and the feedback pipeline once more as its
#   last step. sanitize_html makes nbconvert emit no script for JavaScript/widget outputs and pass
#   HTML/markdown outputs through clean_html, here the course's bleach policy (tables, headings and
#   images survive; nbconvert's own would escape them). nbgrader's templates render markdown cells
#   and MathJax without clean_html, so Formgrader's MathJax is unchanged. Feedback pages also carry a
#   Content-Security-Policy forbidding all script (their MathJax would need script: math shows as TeX).
c.HTMLExporter.sanitize_html = True
c.HTMLExporter.preprocessors = [_html_safety.SanitizeNotebook]
c.HTMLExporter.filters = dict(c.HTMLExporter.filters, clean_html=_html_safety.clean_html)
c.GenerateFeedback.preprocessors = list(c.GenerateFeedback.preprocessors) + [_html_safety.SanitizeNotebook]
c.GenerateFeedback.exporter_class = _html_safety.FeedbackExporter

# --- planted files: nothing a student leaves behind is followed, opened or copied as its target ------
# (rlhf_lab/instructor/grader/safe_files.py and preflight_hook.py)
# * generate_feedback: before a student's autograded/ folder is rendered and its extra files copied
#   into feedback/, every link, FIFO, socket, device, hard link and file over 100 MiB (sparse or not)
#   in it is moved to integrity/quarantine/<student>/<assignment>/feedback/ and dropped from what is
#   rendered; an error names the student and the file, and the class gets its feedback.
# * autograde: right after execution the same sweep runs on the student's autograded/ folder, so
#   nbgrader's permission walk never chmods through a link the kernel left there.
# * nbgrader reads every timestamp.txt without following a link or blocking on a FIFO.
# * collect copies a submission without following anything; release_feedback releases only plain files.
_planted = _course_module("grader/preflight_hook.py", "rlhf_lab_course_preflight_hook")
_planted.install_safe_timestamps()
c.GenerateFeedback.pre_convert_hook = _preflight.feedback_pre
_sweep = _planted.planted_file_sweep(_root)
_steps = list(c.Autograde.autograde_preprocessors)
_at = _steps.index(_JudgedExecute) + 1  # right after the (judged) Execute
c.Autograde.autograde_preprocessors = _steps[:_at] + [_sweep] + _steps[_at:]
c.ExchangeFactory.collect = _planted.safe_collect_class()
c.ExchangeFactory.release_feedback = _planted.safe_release_feedback_class()

# --- points: source/ and the gradebook agree, or every autograde says so ------------------------------
# (rlhf_lab/instructor/grader/points_sync.py) nbgrader grades with the points the gradebook recorded at
# the last `nbgrader generate_assignment`; a test whose points changed in source/ since then is named,
# with the command that updates the gradebook, at the start of every autograde (CLI, Formgrader, course
# command, Dask). Nothing is changed.
_points_sync = _course_module("grader/points_sync.py", "rlhf_lab_course_points_sync")
c.PointsDrift.source_root = os.path.join(_root, "source")
c.PointsDrift.course_id = c.CourseDirectory.course_id
from nbgrader.converters.autograde import Autograde as _Autograde  # noqa: E402

_sanitize = (list(c.Autograde.sanitize_preprocessors) if "sanitize_preprocessors" in c.Autograde
             else list(_Autograde.class_traits()["sanitize_preprocessors"].default()))
if _points_sync.PointsDrift not in _sanitize:
    c.Autograde.sanitize_preprocessors = [_points_sync.PointsDrift] + _sanitize

# --- feedback pages: the course's MathJax, offline; wrapped lines (begin; grader/html_safety.py) ---
# FeedbackExporter typesets math with the MathJax that `jupyter-server-mathjax` (requirements.txt)
# installs with the course, never a CDN: served by the Jupyter server when the page is opened in
# JupyterLab (/files/...), else this file:// URL (a page opened from disk: feedback/, or a student's
# fetched <assignment>/feedback/<time>/ on the same machine). Its one inline loader is the only script
# the page's Content-Security-Policy lets run, by its SHA-256 (this supersedes "forbidding all script"
# above); "" switches MathJax off and the page runs no script at all (math shows as TeX). Long lines of
# outputs, tracebacks and code wrap, so a failing cell's diagnosis is never cut off at the right edge.
c.FeedbackExporter.mathjax_url = _html_safety.local_mathjax_url()
c.FeedbackExporter.wrap_long_lines = True
# --- feedback pages (end) ---
