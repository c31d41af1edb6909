"""Matplotlib in the grading sandbox: fonts found, a figure rendered, nothing written to stderr.

Every graded notebook imports matplotlib in its first cell. Inside the bubblewrap sandbox
(``rlhf_lab/instructor/grader/sandbox.py``) the kernel runs as an unprivileged user id of its own
when the grader is root; matplotlib asks fontconfig (``fc-list``) for the system fonts, and when
fontconfig cannot read ``/etc/fonts`` it writes ``Fontconfig error: Cannot load default config
file`` to the kernel's stderr, which reached the first cell of every feedback page.
"""
from __future__ import annotations

import os

import nbformat
import pytest
from traitlets.config import Config

from course_support import REPO, load_module

sandbox = load_module(REPO / "helpers/rlhf_lab/instructor/grader/sandbox.py", "rlhf_lab_course_sandbox")
kernel_guard = sandbox._kernel_guard

needs_bwrap = pytest.mark.skipif(sandbox.find_bwrap() is None, reason="bubblewrap (bwrap) is not installed")

PLOT = """\
%matplotlib inline
import matplotlib.pyplot as plt
from matplotlib import font_manager
fig, ax = plt.subplots(figsize=(3, 2))
ax.plot([0.0, 0.5, 1.0], [0.0, 0.3, 0.4], label="reward")
ax.set_title("reward against KL")
ax.legend()
plt.show()
print("font:", font_manager.findfont("DejaVu Sans", fallback_to_default=False))
"""


def _run(tmp_path, cells):
    course = tmp_path / "course"
    folder = course / "autograded" / "alice" / "a1_ppo_objective"
    folder.mkdir(parents=True)
    c = Config()
    c.Execute.kernel_manager_class = sandbox.SandboxedKernelManager
    c.Execute.timeout = 120
    c.Execute.startup_timeout = 120
    c.SandboxedKernelManager.course_root = str(course)
    c.SandboxedKernelManager.compile_cache_root = ""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb, _ = kernel_guard.Execute(config=c).preprocess(nb, {"metadata": {"path": str(folder)},
                                                          "unique_key": "01_clipped_objective"})
    return [list(cell.outputs) for cell in nb.cells]


@needs_bwrap
@pytest.mark.slow
def test_matplotlib_renders_in_the_sandbox_without_a_word_on_stderr(tmp_path, monkeypatch):
    # as nbgrader_config.py does for grading: the kernel chooses its own (inline) backend
    monkeypatch.delenv("MPLBACKEND", raising=False)
    outputs = _run(tmp_path, [PLOT, "import subprocess\nprint(subprocess.run(['fc-match', 'sans'], "
                                    "capture_output=True, text=True).stderr or 'no fontconfig error')"])
    flat = [o for cell in outputs for o in cell]
    stderr = [o.get("text", "") for o in flat if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    errors = [f"{o.get('ename')}: {o.get('evalue')}" for o in flat if o.get("output_type") == "error"]
    assert not errors, errors
    assert not stderr, stderr  # before the fix: "Fontconfig error: Cannot load default config file"
    images = [o for o in outputs[0] if o.get("output_type") == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) == 1, outputs[0]
    text = "".join(o.get("text", "") for cell in outputs for o in cell if o.get("output_type") == "stream")
    assert "font: " in text and "DejaVuSans" in text, text
    assert "no fontconfig error" in text, text  # fontconfig itself reads its configuration in there
    if os.geteuid() == 0:  # the case that failed: the kernel runs as a user id of its own
        assert "Fontconfig" not in text
