"""Hostile and broken submissions, and what the grader must do with each.

Every case is built deterministically from the committed ``release/`` and the solutions in
``source/`` (through :mod:`.submissions`): a correct submission with one thing done to it, as a
student would. ``tools/make_hostile.py`` writes them to ``examples/hostile/<student>/...`` with
``examples/hostile/CASES.json``; ``tests/test_trust.py`` grades them with the real pipeline
(:func:`run_hostile_class`, which is ``pipeline.run_class``) and ``tools/trust_report.py`` turns the result into
``docs/trust_report.md``.

A case states its expectations in terms of nbgrader grade cells:

* ``auto_zero``: cells whose autograder score must be 0 by nbgrader alone (the hidden tests or
  the kernel guard already refuse the cheat), before any integrity override;
* ``unscored``: cells nbgrader leaves without any autograder score (a deleted test: it is not run,
  and nbgrader marks it for manual grading);
* ``zero``: cells whose final score must be 0 (after the integrity override);
* ``full``: cells that must keep full points (work that is honest and finished);
* ``findings``: integrity finding codes the pre-flight must report for the student;
* ``evidence``: text that must appear in the error output of the first ``auto_zero`` cell of the
  autograded notebook (the runtime defence's own message), if any.

Everything the submission targets is in ``ppo_objective/01_clipped_objective.ipynb`` (the
fastest graded notebook) unless the case says otherwise; the other notebook of the assignment is
not submitted, so every hostile student also has a ``missing-notebook`` finding for it.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import nbformat

from . import submissions
from .pipeline import course_root

A = "ppo_objective"
NB = "01_clipped_objective"
NB_FILE = NB + ".ipynb"
T_SUR, T_TAB, T_BND, T_CAP = (f"{NB}/test_ppo_surrogate", f"{NB}/test_surrogate_table",
                              f"{NB}/test_clip_boundary", f"{NB}/test_capped_pair")
ALL_TESTS = [T_SUR, T_TAB, T_BND, T_CAP]
CASES_FILE = "CASES.json"

_HEAD = '''def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):
    """PPO's per-sample surrogate (see the task)."""
    ratio = jnp.asarray(ratio, dtype=jnp.float32)
    advantage = jnp.asarray(advantage, dtype=jnp.float32)
    if not clip:
        return ratio * advantage
'''
#: The classic mistake every tampering case hides: the ratio is clipped but the signed min is dropped.
WRONG_SURROGATE = _HEAD + "    return jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * advantage\n"


def _with(prefix: str, body: str = WRONG_SURROGATE) -> str:
    return prefix.strip("\n") + "\n\n" + body


@dataclasses.dataclass
class Case:
    student: str
    title: str
    attack: str
    assignment: str = A
    auto_zero: list = dataclasses.field(default_factory=list)
    unscored: list = dataclasses.field(default_factory=list)  # nbgrader itself records no score (None)
    zero: list = dataclasses.field(default_factory=list)
    full: list = dataclasses.field(default_factory=list)
    findings: list = dataclasses.field(default_factory=list)
    evidence: str = ""
    ungraded: bool = False  # nbgrader itself cannot grade anything (no usable notebook)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _cell_index(nb, gid: str) -> int:
    for i, c in enumerate(nb.cells):
        if submissions.grade_id(c) == gid:
            return i
    raise KeyError(gid)


def _replace(nb, gid: str, code: str):
    return submissions.replace_cell(nb, gid, code)


def _move_before(nb, gid: str, before_gid: str):
    nb = copy.deepcopy(nb)
    cell = nb.cells.pop(_cell_index(nb, gid))
    nb.cells.insert(_cell_index(nb, before_gid), cell)
    return nb


def _insert_after(nb, gid: str, code: str, cell_id: str = "student-added-cell"):
    """A copy of ``nb`` with a new (student) code cell after ``gid``; its id is fixed (deterministic)."""
    nb = copy.deepcopy(nb)
    cell = nbformat.v4.new_code_cell(code)
    if nb.get("nbformat_minor", 5) >= 5:
        cell["id"] = cell_id
    else:
        cell.pop("id", None)
    nb.cells.insert(_cell_index(nb, gid) + 1, cell)
    return nb


def build_cases(root=None) -> tuple[list[Case], dict]:
    """All cases and their files: ``(cases, {student: {assignment: {file name: str | bytes}}})``."""
    root = course_root(root)
    correct = submissions.correct_submission(A, root)[NB]
    losses = submissions.correct_submission("ppo_rlhf", root)
    dumps = submissions.dumps
    cases: list[Case] = []
    files: dict = {}

    def add(case: Case, nbs: dict) -> None:
        cases.append(case)
        files[case.student] = {case.assignment: nbs}

    # --- controls ---------------------------------------------------------------------------------
    add(Case("h00_control_correct", "control: a correct submission",
             "every answer of 01_clipped_objective correct (the reference point for the others)",
             full=ALL_TESTS, findings=["missing-notebook"]), {NB_FILE: dumps(correct)})

    # --- nbgrader's own defences (checksums) ------------------------------------------------------
    nb = _replace(correct, "ppo_surrogate", WRONG_SURROGATE)
    nb = _replace(nb, "test_ppo_surrogate", "pass")
    add(Case("h01_test_edited_to_pass", "test cell edited to `pass`",
             "the locked test cell of ppo_surrogate replaced by `pass`, and ppo_surrogate is wrong",
             auto_zero=[T_SUR], zero=[T_SUR], full=[T_TAB, T_BND, T_CAP], findings=["edited-test"],
             evidence="ppo_surrogate"), {NB_FILE: dumps(nb)})

    nb = _replace(correct, "ppo_surrogate", WRONG_SURROGATE)
    nb = copy.deepcopy(nb)
    del nb.cells[_cell_index(nb, "test_ppo_surrogate")]
    add(Case("h02_test_cell_deleted", "test cell deleted",
             "the locked test cell of ppo_surrogate deleted, and ppo_surrogate is wrong",
             unscored=[T_SUR], zero=[T_SUR], full=[T_TAB, T_BND, T_CAP], findings=["deleted-test"]),
             {NB_FILE: dumps(nb)})

    nb = _replace(correct, "ppo_surrogate", WRONG_SURROGATE)
    i = _cell_index(nb, "test_ppo_surrogate")
    nb.cells[i].source = ("### BEGIN HIDDEN TESTS\nprint('all hidden tests passed')\n### END HIDDEN TESTS\n"
                          + nb.cells[i].source.replace("np.testing.assert_allclose", "print"))
    nb.cells[i].metadata["nbgrader"]["points"] = 60
    nb.cells[i].metadata["nbgrader"]["locked"] = False
    add(Case("h03_hidden_test_tampered", "hidden-test cell tampered with",
             "a fake hidden-test block written into the test cell, its asserts turned into prints, the cell "
             "unlocked and its points raised to 60; ppo_surrogate is wrong",
             auto_zero=[T_SUR], zero=[T_SUR], full=[T_TAB, T_BND, T_CAP], findings=["edited-test"],
             evidence="ppo_surrogate"), {NB_FILE: dumps(nb)})

    # --- monkeypatching what the tests rely on ----------------------------------------------------
    patches = [
        ("h04_patch_np_testing", "np.testing.assert_allclose replaced",
         "np.testing.assert_allclose = lambda *args, **kwargs: None", "numpy.testing.assert_allclose"),
        ("h05_patch_jnp_allclose", "jnp.allclose replaced", "jnp.allclose = lambda *args, **kwargs: True",
         "jax.numpy.allclose"),
        ("h06_patch_jax_grad", "jax.grad replaced",
         "jax.grad = lambda fun, *args, **kwargs: (lambda *a, **k: jnp.zeros(()))", "jax.grad"),
        ("h07_patch_float", "`float` rebound in the notebook", "float = lambda value=0.0: 0.0",
         "the built-in 'float'"),
        ("h08_patch_library", "the course library's function replaced",
         "import rlhf_lab\nimport rlhf_lab.ppo\nrlhf_lab.clipped_surrogate = lambda r, a, e=0.2: "
         "jnp.clip(r, 1 - e, 1 + e) * a\nrlhf_lab.ppo.clipped_surrogate = rlhf_lab.clipped_surrogate",
         "rlhf_lab"),
        ("h09_patch_grading", "the grading primitives and the trusted reference replaced",
         "grading.close = lambda *args, **kwargs: None\ngrading.check = lambda *args, **kwargs: None\n"
         "grading.matches = lambda *args, **kwargs: True\n"
         "grading.reference.clipped_surrogate = lambda r, a, e=0.2: jnp.clip(r, 1 - e, 1 + e) * a",
         "grading."),
    ]
    for student, title, code, evidence in patches:
        nb = _replace(correct, "ppo_surrogate", _with(code))
        add(Case(student, title, f"the answer cell runs `{code.splitlines()[-1]}` (and more) and ppo_surrogate "
                                 "is wrong: plain tests relying on the patched name would pass",
                 auto_zero=ALL_TESTS, zero=ALL_TESTS,
                 findings=["tamper-attribute" if student not in ("h07_patch_float",) else "rebind-builtin"],
                 evidence="tampering detected"), {NB_FILE: dumps(nb)})

    nb = _replace(correct, "ppo_surrogate", _HEAD + '''    class Anything(np.ndarray):
        """An array that compares equal to everything and is always true."""
        def __eq__(self, other):
            return True
        def __ne__(self, other):
            return False
        def __bool__(self):
            return True
    return np.zeros(jnp.broadcast_shapes(ratio.shape, advantage.shape)).view(Anything)
''')
    add(Case("h10_eq_always_true", "answer object whose `__eq__` always returns True",
             "ppo_surrogate returns an array subclass whose __eq__ is always True (fools `assert x == y`)",
             auto_zero=[T_SUR], zero=ALL_TESTS, full=[], findings=["fake-dunder"], evidence="ppo_surrogate"),
             {NB_FILE: dumps(nb)})

    nb = _replace(correct, "ppo_surrogate", _with(
        "import unittest\nunittest.TestCase.assertEqual = lambda *args, **kwargs: None\n"
        "unittest.TestCase.assertTrue = lambda *args, **kwargs: None\n"
        "np.testing.assert_array_equal = lambda *args, **kwargs: None"))
    add(Case("h11_fake_assert_helpers", "unittest / np.testing assertion helpers replaced",
             "unittest.TestCase.assertEqual/assertTrue and np.testing.assert_array_equal made no-ops; "
             "ppo_surrogate is wrong", auto_zero=ALL_TESTS, zero=ALL_TESTS, findings=["tamper-attribute"],
             evidence="tampering detected"), {NB_FILE: dumps(nb)})

    nb = _replace(correct, "ppo_surrogate", '''import os
import rlhf_lab


def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):
    """Lets the library do the work only when the autograder runs."""
    ratio = jnp.asarray(ratio, dtype=jnp.float32)
    advantage = jnp.asarray(advantage, dtype=jnp.float32)
    if not clip:
        return ratio * advantage
    if os.environ.get("NBGRADER_EXECUTION"):
        return rlhf_lab.clipped_surrogate(ratio, advantage, epsilon)
    return jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * advantage
''')
    add(Case("h12_grading_detection", "different behaviour when NBGRADER_EXECUTION is set",
             "ppo_surrogate hands the work to the course library only when it sees NBGRADER_EXECUTION",
             auto_zero=[T_SUR], zero=ALL_TESTS, full=[], findings=["grading-detection"],
             evidence="not delegated"), {NB_FILE: dumps(nb)})

    nb = _replace(correct, "clip_boundary", "import os\nos._exit(0)\n\n"
                  + submissions.solution_text(_source_cell(root, A, NB, "clip_boundary")))
    add(Case("h13_os_exit", "a cell that kills the kernel (`os._exit`)",
             "the clip_boundary answer cell calls os._exit(0) before defining the function",
             auto_zero=[T_BND, T_CAP], zero=[T_BND, T_CAP], full=[T_SUR, T_TAB], findings=["blocked-call"],
             evidence="kernel"), {NB_FILE: dumps(nb)})

    nb = _replace(correct, "surrogate_table", '''def surrogate_table(ratios, advantages, epsilon=0.2, surrogate=ppo_surrogate):
    """The table, copied from the printout."""
    unclipped = jnp.array([1.8, 1.05, -1.8, -0.3, 0.3])
    clipped = jnp.array([1.2, 1.05, -1.8, -0.8, 0.3])
    diverge = jnp.array([True, False, False, True, False])
    return unclipped, clipped, diverge
''')
    add(Case("h14_hard_coded", "hard-coded printed numbers",
             "surrogate_table returns the five-case table copied from the printout instead of computing it",
             auto_zero=[T_TAB], zero=[T_TAB], full=[T_SUR, T_BND, T_CAP], findings=[],
             evidence="fresh inputs"), {NB_FILE: dumps(nb)})

    # --- delegation to the course library ---------------------------------------------------------
    lnb = _replace(losses["01_losses"], "ppo_loss_answer", "from rlhf_lab import ppo_loss\n")
    ltests = ["01_losses/test_clip_named_terms", "01_losses/test_clip_both_signs", "01_losses/test_kl_term",
              "01_losses/test_ppo_loss_value_grad", "01_losses/test_ppo_loss_detached"]
    add(Case("h15_delegate_import", "delegation: `from rlhf_lab import ppo_loss`",
             "ppo_rlhf/01_losses: the ppo_loss answer cell is just `from rlhf_lab import ppo_loss`",
             assignment="ppo_rlhf", auto_zero=ltests[1:], zero=ltests[1:],
             full=["01_losses/test_preference_loss"], findings=["library-use"], evidence="not delegated"),
        {"01_losses.ipynb": dumps(lnb)})

    nb = _replace(correct, "ppo_surrogate", '''import rlhf_lab.ppo


def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):
    """A thin wrapper around the library."""
    if not clip:
        return jnp.asarray(ratio, dtype=jnp.float32) * jnp.asarray(advantage, dtype=jnp.float32)
    return rlhf_lab.ppo.clipped_surrogate(jnp.asarray(ratio, dtype=jnp.float32),
                                          jnp.asarray(advantage, dtype=jnp.float32), epsilon)
''')
    add(Case("h16_delegate_wrapper", "delegation: thin wrapper", "ppo_surrogate wraps rlhf_lab.ppo.clipped_surrogate",
             auto_zero=[T_SUR], zero=[T_SUR], full=[T_TAB, T_BND, T_CAP], findings=["library-use"],
             evidence="not delegated"), {NB_FILE: dumps(nb)})

    nb = _insert_after(correct, "imports", "from rlhf_lab import clipped_surrogate as _clip_objective")
    nb = _replace(nb, "ppo_surrogate", _HEAD + "    return _clip_objective(ratio, advantage, epsilon)\n")
    add(Case("h17_delegate_alias", "delegation: alias imported at the top of the notebook",
             "a cell at the top imports clipped_surrogate under another name; ppo_surrogate calls the alias",
             auto_zero=[T_SUR], zero=[T_SUR], full=[T_TAB, T_BND, T_CAP], findings=["library-use"],
             evidence="not delegated"), {NB_FILE: dumps(nb)})

    # --- kernel killers ---------------------------------------------------------------------------
    table_code = submissions.solution_text(_source_cell(root, A, NB, "surrogate_table"))
    nb = _replace(correct, "surrogate_table", "while True:  # never finishes\n    pass\n\n" + table_code)
    add(Case("h18_infinite_loop", "infinite loop", "the surrogate_table cell loops forever before defining the function",
             auto_zero=[T_TAB], zero=[T_TAB], full=[T_SUR, T_BND, T_CAP], findings=[], evidence="Timeout"),
        {NB_FILE: dumps(nb)})

    nb = _replace(correct, "surrogate_table", "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                  "while True:  # ignores the interrupt sent at the timeout\n    pass\n\n" + table_code)
    add(Case("h19_loop_ignoring_interrupt", "infinite loop that ignores the interrupt",
             "the surrogate_table cell ignores SIGINT and loops forever (the per-cell timeout's interrupt "
             "cannot stop it)", auto_zero=[T_TAB, T_BND, T_CAP], zero=[T_TAB, T_BND, T_CAP], full=[T_SUR],
             findings=["blocked-import"], evidence="kernel"), {NB_FILE: dumps(nb)})

    nb = _replace(correct, "surrogate_table", "hog = np.ones((2**31,))  # 16 GiB\n\n" + table_code)
    add(Case("h20_huge_memory", "a cell that allocates far too much memory",
             "the surrogate_table cell allocates a 16 GiB array before defining the function",
             auto_zero=[T_TAB], zero=[T_TAB], full=[T_SUR, T_BND, T_CAP], findings=[], evidence="MemoryError"),
        {NB_FILE: dumps(nb)})

    # --- malformed notebooks ----------------------------------------------------------------------
    nb = _move_before(correct, "ppo_surrogate", "setup_grading")
    add(Case("h21_reordered_cells", "cells reordered",
             "the ppo_surrogate answer cell moved above the locked grading and import cells (it runs before "
             "the grader's snapshot)", zero=ALL_TESTS, findings=["reordered", "code-before-start"]),
        {NB_FILE: dumps(nb)})

    nb = copy.deepcopy(correct)
    nb.metadata["kernelspec"] = {"name": "ir", "display_name": "R", "language": "R"}
    add(Case("h22_wrong_kernel", "wrong kernel name", "the notebook's metadata asks for the R kernel",
             full=ALL_TESTS, findings=["kernel-name"]), {NB_FILE: dumps(nb)})

    add(Case("h23_other_assignment", "a notebook from the other assignment",
             "ppo_rlhf's 01_losses.ipynb saved under the name 01_clipped_objective.ipynb",
             zero=ALL_TESTS, findings=["other-assignment"], ungraded=True),
        {NB_FILE: dumps(losses["01_losses"])})

    text = dumps(correct)
    add(Case("h24_invalid_json", "invalid JSON", "the notebook file is cut off in the middle (not JSON)",
             zero=ALL_TESTS, findings=["invalid-notebook"], ungraded=True), {NB_FILE: text[: len(text) // 2]})

    add(Case("h25_renamed_notebook", "notebook renamed", "the notebook was saved as '01_clipped_objective (1).ipynb'",
             zero=ALL_TESTS, findings=["renamed-notebook"], ungraded=True),
        {"01_clipped_objective (1).ipynb": text})

    add(Case("h26_missing_notebook", "notebook missing", "the assignment folder holds only a README.txt",
             zero=ALL_TESTS, findings=["missing-notebook", "extra-file"], ungraded=True),
        {"README.txt": "I could not get the notebook to open, sorry!\n"})

    add(Case("h27_extra_files", "extra files in the folder",
             "a correct notebook plus a data file, a note and a scratch module",
             full=ALL_TESTS, findings=["extra-file"]),
        {NB_FILE: text, "data/ratios.csv": "ratio,advantage\n1.8,1.0\n0.3,-1.0\n",
         "notes.md": "# my notes\n", "scratch_helpers.py": "def helper():\n    return 1\n"})

    add(Case("h28_shadow_module", "an extra file that shadows a module",
             "a correct notebook plus numpy.py, which would be imported instead of NumPy while grading",
             zero=ALL_TESTS, findings=["shadow-module"]),
        {NB_FILE: text, "numpy.py": "raise SystemExit('this file replaces numpy')\n"})

    add(Case("h29 zoë ångström", "a student folder with spaces and non-ASCII characters",
             "a correct notebook in a folder named 'h29 zoë ångström'", full=ALL_TESTS,
             findings=["student-id-characters"]), {NB_FILE: text})
    return cases, files


def _source_cell(root, assignment: str, notebook: str, gid: str):
    nb = nbformat.read(str(Path(root) / "source" / assignment / f"{notebook}.ipynb"), as_version=4)
    return nb.cells[_cell_index(nb, gid)]


# ------------------------------------------------------------------------------------- on disk
def write_cases(root=None, dest=None) -> list[Case]:
    """(Re)write ``examples/hostile/`` (every case's files and ``CASES.json``)."""
    import shutil

    root = course_root(root)
    dest = Path(dest) if dest is not None else root / "examples" / "hostile"
    cases, files = build_cases(root)
    if dest.exists():
        shutil.rmtree(dest)
    for student, by_assignment in files.items():
        for assignment, nbs in by_assignment.items():
            for name, content in nbs.items():
                path = dest / student / assignment / name
                path.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    path.write_bytes(content)
                else:
                    path.write_text(content, encoding="utf-8")
    (dest / CASES_FILE).write_text(json.dumps([c.to_dict() for c in cases], indent=1, ensure_ascii=False) + "\n",
                                   encoding="utf-8")
    return cases


def load_cases(folder=None) -> list[Case]:
    folder = Path(folder) if folder is not None else course_root() / "examples" / "hostile"
    return [Case(**d) for d in json.loads((folder / CASES_FILE).read_text(encoding="utf-8"))]


def cases_diff(root=None) -> list[str]:
    """Files of ``examples/hostile/`` that differ from a fresh build (empty: in sync)."""
    import tempfile

    root = course_root(root)
    have = root / "examples" / "hostile"
    with tempfile.TemporaryDirectory() as tmp:
        write_cases(root, Path(tmp) / "hostile")
        want = Path(tmp) / "hostile"
        names = {str(p.relative_to(want)) for p in want.rglob("*") if p.is_file()}
        names |= {str(p.relative_to(have)) for p in have.rglob("*") if p.is_file()} if have.is_dir() else set()
        return sorted(n for n in names
                      if not (want / n).is_file() or not (have / n).is_file()
                      or (want / n).read_bytes() != (have / n).read_bytes())


# ------------------------------------------------------------------------------- grading them
@dataclasses.dataclass
class TrustedRun:
    """A class graded with the integrity pre-flight and overrides around real nbgrader runs."""

    root: Path
    db_url: str
    reports: dict  # {assignment: IntegrityReport}
    runs: list  # [pipeline.StudentRun]
    overrides: list  # [integrity.Override]
    grades: object  # pipeline.Grades
    feedback: dict  # {assignment: {student: [html]}}
    csv_path: Path
    seconds: dict

    def findings(self, student: str) -> list:
        return [f for rep in self.reports.values() for f in rep.for_student(student)]

    def run_of(self, student: str, assignment: str):
        for r in self.runs:
            if r.student == student and r.assignment == assignment:
                return r
        return None


def from_class_run(result) -> TrustedRun:
    """A :class:`TrustedRun` view of :func:`rlhf_lab.instructor.pipeline.run_class`'s result."""
    from . import integrity

    overrides = []
    for report in result.integrity.values():  # idempotent: re-applying lists what is withheld
        overrides += integrity.apply_overrides(report, result.root, result.db_url)
    return TrustedRun(result.root, result.db_url, dict(result.integrity), list(result.runs), overrides,
                      result.grades, result.feedback, result.csv_path, dict(result.seconds))


def copy_cases(root=None, dest=None) -> Path:
    """Copy ``examples/hostile`` (without CASES.json) to ``dest`` (default ``<root>/hostile_submissions``)."""
    import shutil

    root = course_root(root)
    src = root / "examples" / "hostile"
    dest = Path(dest) if dest is not None else root / "hostile_submissions"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(CASES_FILE))
    return dest


def _require_kernel_limits(root: Path) -> None:
    """Refuse to run the memory case on a course whose kernels are not memory-limited.

    ``h20_huge_memory`` asks for 16 GiB; with the kernel guard it is a ``MemoryError``, without it a
    machine with less free memory would go to its OOM killer.
    """
    import os

    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    first = cfg.Autograde.autograde_preprocessors[0]
    limit = int(os.environ.get("RLHF_KERNEL_MEMORY_MB", "4096") or 0)
    if "kernel_guard" not in getattr(first, "__module__", "") or not 0 < limit <= 16384:
        raise RuntimeError(f"{root}/nbgrader_config.py does not start kernels under the memory limit "
                           "(rlhf_lab kernel_guard.Execute with 0 < RLHF_KERNEL_MEMORY_MB <= 16384): "
                           "refusing to run the hostile memory case")


def run_hostile_class(root=None, db_url: str | None = None, grader=None, progress=None,
                      cases: list | None = None) -> TrustedRun:
    """Grade every hostile case (``examples/hostile``) with the course pipeline in ``root`` (use a copy).

    :func:`rlhf_lab.instructor.pipeline.run_class` without regenerating the release: collect ->
    integrity pre-flight -> autograde -> integrity overrides -> feedback -> export.
    """
    from . import pipeline

    root = course_root(root)
    _require_kernel_limits(root)
    cases = cases if cases is not None else load_cases(root / "examples" / "hostile")
    names = sorted({c.assignment for c in cases})
    subs = copy_cases(root)
    result = pipeline.run_class(subs, root=root, db_url=db_url, names=names, fresh=False, regenerate=False,
                                grader=grader, progress=progress)
    return from_class_run(result)


# ---------------------------------------------------------------------------------- verdicts
def _autograded_errors(root: Path, student: str, assignment: str) -> list[str]:
    out = []
    for path in sorted((root / "autograded" / student / assignment).glob("*.ipynb")):
        try:
            nb = nbformat.read(str(path), as_version=4)
        except Exception:  # noqa: BLE001
            continue
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                if o.get("output_type") == "error":
                    value = o.get("evalue") or ""
                    if not value and o.get("traceback"):  # nbgrader's timeout error keeps its text there
                        value = re.sub(r"\x1b\[[0-9;]*m", "", o["traceback"][-1]).split(": ", 1)[-1]
                    out.append(f"{o.get('ename')}: {value}")
    return out


@dataclasses.dataclass
class Verdict:
    """What the grader did with one case, and whether it met the case's expectations."""

    case: Case
    scores: dict  # {"notebook/grade_id": (auto_score, final_score, max_score)}
    total: tuple  # (final score, max) over the case's notebook cells
    findings: list  # [Finding] for the student
    run_reason: str  # the autograde run's failure reason ("" if it ran)
    evidence: str  # the first error text that contains the case's evidence ("" if none / not found)
    problems: list  # unmet expectations (empty: the grader did the right thing)

    @property
    def ok(self) -> bool:
        return not self.problems

    def action(self) -> str:
        """One sentence: what the grader did."""
        blocking = [f for f in self.findings if f.blocking
                    and (f.code != "missing-notebook" or f.notebook == NB_FILE and self.case.assignment == A)]
        warns = [f for f in self.findings if not f.blocking]
        parts = []
        if self.evidence:
            parts.append(f"autograder: {self.evidence[:160]}")
        elif self.run_reason:
            parts.append(f"nbgrader could not grade it ({self.run_reason[:120]})")
        if blocking:
            codes = ", ".join(dict.fromkeys(f.code for f in blocking))
            acts = [f.action for f in blocking if f.action]
            parts.append(f"integrity BLOCK [{codes}]: {blocking[0].message[:160]}"
                         + (f" ({acts[0]})" if acts else "") + "; points withheld for review")
        elif [w for w in warns if w.code in self.case.findings]:
            w = [w for w in warns if w.code in self.case.findings][0]
            parts.append(f"integrity warning [{w.code}]: {w.message[:140]}")
        if not parts:
            parts.append("graded normally by the hidden tests")
        return "; ".join(parts)


def verdict(case: Case, run: TrustedRun) -> Verdict:
    """Check one case against its expectations in a graded :class:`TrustedRun`."""
    by_cell = run.grades.by_cell(case.student, case.assignment)
    auto = {}
    from nbgrader.api import Gradebook, MissingEntry

    from . import pipeline

    pipeline.ensure_venv_on_path()
    with Gradebook(run.db_url, pipeline.COURSE_ID) as gb:
        for key in set(case.auto_zero + case.unscored + case.zero + case.full):
            nb, gid = key.split("/")
            try:
                g = gb.find_grade(gid, nb, case.assignment, case.student)
                auto[key] = (g.auto_score, float(g.score), float(g.max_score))
            except MissingEntry:
                auto[key] = (None, None, None)
    problems = []
    for key in case.auto_zero:
        a, _, _ = auto[key]
        if a not in (0, 0.0):
            problems.append(f"{key}: the autograder gave {a}, expected 0 before any override")
    for key in case.unscored:
        a, _, _ = auto[key]
        if a is not None:
            problems.append(f"{key}: the autograder gave {a}, expected no autograder score (cell not run)")
    for key in case.zero:
        _, s, _ = auto[key]
        if s is None or s != 0:
            problems.append(f"{key}: final score {s}, expected 0")
    for key in case.full:
        _, s, m = auto[key]
        if s is None or m is None or s != m:
            problems.append(f"{key}: final score {s} of {m}, expected full points")
    findings = run.findings(case.student)
    codes = {f.code for f in findings}
    for code in case.findings:
        if code not in codes:
            problems.append(f"integrity finding {code!r} missing (got {sorted(codes)})")
    r = run.run_of(case.student, case.assignment)
    reason = "" if r is None or r.ok else r.reason.replace(str(run.root) + "/", "").replace(str(run.root), ".")
    if r is None and not case.ungraded and case.student not in sum((rep.ungradable() for rep in run.reports.values()), []):
        problems.append("the student was not autograded")
    evidence = ""
    if case.evidence:
        errors = _autograded_errors(run.root, case.student, case.assignment)
        evidence = next((e for e in errors if case.evidence.lower() in e.lower()), "")
        if not evidence:
            problems.append(f"no error output mentions {case.evidence!r} (errors: {[e[:80] for e in errors][:4]})")
    nb_cells = [c for c in by_cell.values() if c.notebook == case.full[0].split("/")[0]] if case.full else \
        [c for c in by_cell.values() if any(k.split("/")[0] == c.notebook for k in case.zero + case.auto_zero)]

    total = (sum((c.score or 0.0) for c in nb_cells if c.kind in ("test", "answer")),
             sum(c.max_score for c in nb_cells if c.kind in ("test", "answer")))
    scores = {k: v for k, v in sorted(auto.items())}
    return Verdict(case, scores, total, findings, reason, evidence, problems)


def load_run(root) -> TrustedRun:
    """Rebuild the :class:`TrustedRun` of a course graded earlier by :func:`run_hostile_class`.

    Everything comes from disk: the pipeline's ``grading_report.json`` (runs, timings), the
    integrity reports ``integrity/<assignment>.json``, the gradebook and the feedback folder.
    """
    from . import integrity, pipeline

    root = course_root(root)
    report = json.loads((root / pipeline.REPORT_NAME).read_text(encoding="utf-8"))
    runs = [pipeline.StudentRun(**r) for r in report["runs"]]
    reports = {}
    for a in report["assignments"]:
        data = json.loads((root / integrity.REPORT_TEMPLATE.format(assignment=a)).read_text(encoding="utf-8"))
        reports[a] = integrity.IntegrityReport(a, [integrity.Finding.from_dict(f) for f in data["findings"]],
                                               data["students"])
    db_url = pipeline.default_db_url(root)
    overrides = []
    for rep in reports.values():
        overrides += integrity.apply_overrides(rep, root, db_url)
    grades = pipeline.read_grades(root, db_url)
    fb = {a: pipeline.feedback_files(a, root) for a in report["assignments"]}
    return TrustedRun(root, db_url, reports, runs, overrides, grades, fb, root / "grades.csv",
                      report.get("seconds", {}))
