"""A released notebook opens in JupyterLab without being marked as modified.

JupyterLab writes the kernel's ``language_info`` into a notebook's metadata as soon as its kernel
starts; a notebook without it (or with other values) is then "modified" before the student typed
anything. ``make release`` writes the course kernel's values into every released notebook.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from course_support import REPO

RELEASED = sorted(p for p in (REPO / "release").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def _kernel_language_info() -> dict:
    """What a real python3 kernel of this environment answers to kernel_info."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        reply = kc.kernel_info(reply=True, timeout=60)
        return reply["content"]["language_info"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_every_released_notebook_carries_the_kernels_language_info():
    info = _kernel_language_info()
    assert RELEASED
    for path in RELEASED:
        meta = json.loads(path.read_text(encoding="utf-8"))["metadata"]
        assert meta.get("language_info") == info, path.relative_to(REPO)


@pytest.mark.slow
@pytest.mark.browser
def test_a_released_notebook_opens_unmodified_in_the_student_lab(tmp_path):
    from browser_support import chromium_page, jupyter_lab, wait_for_kernel_idle

    root = tmp_path / "work"
    root.mkdir()
    shutil.copy(REPO / "release" / "a1_ppo_objective" / "01_clipped_objective.ipynb", root / "nb.ipynb")
    with jupyter_lab(root, tmp_path / "state", config_dir=REPO / "jupyter" / "student") as server:
        with chromium_page() as page:
            page.goto(server.notebook_url("nb.ipynb"))
            page.wait_for_selector(".jp-Notebook", timeout=90_000)
            wait_for_kernel_idle(page, server)
            deadline = time.monotonic() + 5  # the kernel's language_info arrives right after it is idle
            while time.monotonic() < deadline:
                time.sleep(0.5)
                classes = page.evaluate("() => document.querySelector('.lm-TabBar-tab.jp-mod-current').className")
                assert "jp-mod-dirty" not in classes, "the notebook opened marked as modified"
