"""Helpers for tests that drive a real JupyterLab in headless Chromium.

Imported by browser test modules (``from browser_support import ...``); it is not a conftest and
pytest does not collect it. Everything it starts is stopped in ``finally`` blocks, even when a test
fails:

* :func:`jupyter_lab` starts ``jupyter lab`` from the test's virtual environment on 127.0.0.1 with a
  random free port and a random token, in an isolated configuration (its own settings, workspace,
  runtime and IPython directories under a temporary folder), and on exit shuts its kernels down
  through the REST API, then terminates the server's process group and finally kills, by pid, any
  process it started that is still alive (kernels run in their own sessions, so the group alone is
  not enough).
* :func:`chromium_page` launches the system Chromium (``shutil.which("chromium")``, never a
  downloaded browser) through Playwright's sync API, headless, with flags that keep it off the
  network, and closes it on exit.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts" / "browser"

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def require_chromium() -> str:
    """Path of the system Chromium, or skip the test with the reason."""
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("chromium is not installed (Debian package 'chromium'; .ci/run installs it)")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _venv_bin() -> Path:
    return Path(sys.executable).parent


@dataclass
class LabServer:
    """A running JupyterLab started by :func:`jupyter_lab`."""

    port: int
    token: str
    root: Path
    process: subprocess.Popen
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def notebook_url(self, relpath: str) -> str:
        return f"{self.base_url}/lab/tree/{relpath}?token={self.token}"

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(
            f"{self.base_url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Block until the server answers ``/api/status`` (raise with its log if it dies or hangs)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                self.api("/api/status")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"jupyter lab did not answer in {timeout:.0f} s:\n{self.log_tail()}")
                time.sleep(0.25)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"


def _write_settings(settings_dir: Path) -> None:
    """JupyterLab user settings for a quiet, deterministic test session."""
    overrides = {
        # Render every cell (no virtual scrolling), so widgets exist in the DOM wherever they are.
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
        # No news or update checks (the machine has no network; they would only add noise).
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false", "checkForUpdates": False,
        },
    }
    for rel, value in overrides.items():
        path = settings_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _kill_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@contextlib.contextmanager
def jupyter_lab(root_dir: Path, state_dir: Path, startup_timeout: float = 90.0, wait: bool = True,
                config_dir: Path | None = None, extra_env: dict | None = None):
    """Run ``jupyter lab`` serving ``root_dir``; yield a :class:`LabServer`; always stop it.

    With ``wait=False`` the server is yielded as soon as its process is started (call
    :meth:`LabServer.wait_ready` later), so other start-up work (the browser) can overlap.
    ``config_dir`` is the server's ``JUPYTER_CONFIG_DIR`` (default: an empty folder under
    ``state_dir``), for example a course's ``jupyter/instructor``; ``extra_env`` is added to the
    server's environment last (a value of ``None`` removes that variable).
    """
    port, token = free_port(), secrets.token_hex(16)
    state_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        PATH=f"{_venv_bin()}{os.pathsep}{env.get('PATH', '')}",
        JAX_PLATFORMS="cpu",
        JUPYTER_CONFIG_DIR=str(config_dir if config_dir is not None else state_dir / "config"),
        JUPYTER_RUNTIME_DIR=str(state_dir / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(state_dir / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(state_dir / "lab-workspaces"),
        IPYTHONDIR=str(state_dir / "ipython"),
        MPLCONFIGDIR=str(state_dir / "mpl"),
        PYTHONUNBUFFERED="1",
    )
    for name, value in (extra_env or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    _write_settings(state_dir / "lab-settings")
    jupyter = _venv_bin() / "jupyter"
    cmd = [
        str(jupyter) if jupyter.exists() else shutil.which("jupyter") or "jupyter",
        "lab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root_dir}",
        "--ServerApp.open_browser=False",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers run as root
    log_path = state_dir / "jupyter-lab.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=root_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    server = LabServer(port=port, token=token, root=root_dir, process=proc, log_path=log_path)
    started: set[int] = set()
    try:
        if wait:
            server.wait_ready(startup_timeout)
        yield server
    finally:
        started.update(_descendants(proc.pid))
        with contextlib.suppress(Exception):
            for kernel in server.api("/api/kernels") or []:
                with contextlib.suppress(Exception):
                    server.api(f"/api/kernels/{kernel['id']}", method="DELETE")
        started.update(_descendants(proc.pid))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        _kill_pids(sorted(started), signal.SIGKILL)  # kernels live in their own sessions
        log.close()


@contextlib.contextmanager
def chromium_page(viewport=(1500, 1400)):
    """A Playwright page in headless system Chromium; the browser is closed on exit."""
    from playwright.sync_api import sync_playwright

    executable = require_chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
            page = context.new_page()
            yield page
        finally:
            browser.close()


def wait_for_kernel_idle(page, server: LabServer, timeout_ms: float = 120_000) -> None:
    """Wait until the notebook's kernel exists, has a client connected and is idle.

    The toolbar's status indicator alone is not enough: it reads "idle" before any kernel has
    been started. The server's ``/api/kernels`` says whether a kernel is really there (it answers
    500 while a kernel is half-started; that counts as not ready).
    """
    deadline = time.monotonic() + timeout_ms / 1000
    while time.monotonic() < deadline:
        try:
            kernels = server.api("/api/kernels") or []
        except urllib.error.HTTPError as err:
            # jupyter_server answers 500 while a kernel it lists is still starting (its model has
            # no last_activity yet); that kernel is not ready, so ask again
            if err.code < 500:
                raise
            kernels = []
        if kernels and all(k["execution_state"] == "idle" and k["connections"] >= 1 for k in kernels):
            status = page.evaluate(
                "() => { const e = document.querySelector('.jp-Notebook-ExecutionIndicator');"
                " return e ? e.getAttribute('data-status') : null; }"
            )
            if status == "idle":
                return
        _accept_kernel_dialog(page)
        page.wait_for_timeout(250)
    raise TimeoutError(f"the notebook's kernel was not ready after {timeout_ms / 1000:.0f} s:\n{server.log_tail()}")


def _accept_kernel_dialog(page) -> None:
    """If JupyterLab asks which kernel to use, take its default (the notebook's python3)."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and "Select Kernel" in dialog.first.inner_text():
        dialog.first.locator("button", has_text="Select").first.click()


def run_all_cells(page, server: LabServer, timeout_ms: float = 120_000) -> None:
    """Run every cell of the open notebook through JupyterLab's Run menu, once the kernel is ready.

    Waits until the first code cell shows that it ran or is running (its prompt is no longer
    empty); if JupyterLab did not accept the command, it is issued once more.
    """
    wait_for_kernel_idle(page, server, timeout_ms)
    started = (
        "() => { const p = document.querySelector('.jp-CodeCell .jp-InputPrompt');"
        " return !!p && /\\[(\\*|\\d+)\\]/.test(p.textContent); }"
    )
    for attempt in range(2):
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:
            page.wait_for_function(started, timeout=15_000)
            return
        except Exception:
            if attempt == 1:
                raise
            _accept_kernel_dialog(page)
            wait_for_kernel_idle(page, server, timeout_ms)
