"""requirements.txt is the one place for pins: environment.yml is generated from it and cannot
drift, the running environment matches it, and the editable package imports from helpers/."""
import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from course_support import load_module

ROOT = Path(__file__).resolve().parent.parent

# Pins the course promises to hold exactly (issue: jax, jaxlib, numpy, nbgrader, jupyterlab,
# ipywidgets, matplotlib and the test tools).
REQUIRED = ["jax", "jaxlib", "numpy", "nbgrader", "jupyterlab", "ipywidgets", "matplotlib",
            "pytest", "hypothesis", "pytest-timeout", "nbclient", "nbformat", "playwright"]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert "==" in line, f"requirements.txt: {line!r} is not an exact pin (name==version)"
        name, version = line.split("==", 1)
        key = name.strip().lower().replace("_", "-")
        assert key not in pins, f"requirements.txt pins {name} twice"
        pins[key] = version.strip()
    return pins


def _generator():
    return load_module(ROOT / "tools" / "make_environment_yml.py", "make_environment_yml")


def test_requirements_are_exact_pins_and_cover_the_required_packages():
    pins = _pins()
    missing = [name for name in REQUIRED if name not in pins]
    assert not missing, f"requirements.txt lacks pins for {missing}"


def test_committed_environment_yml_equals_the_generator_output():
    committed = (ROOT / "environment.yml").read_text()
    assert committed == _generator().render(), (
        "environment.yml is stale: regenerate it with `make environment.yml`"
    )


def test_environment_yml_pip_section_equals_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    pip_sections = [d["pip"] for d in deps if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip: section"
    pip_lines = [str(x).strip() for x in pip_sections[0]]
    pins = [
        ln.strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()
        if ln.strip() and not ln.strip().startswith("#")
    ]
    for pin in pins:
        assert pip_lines.count(pin) == 1, f"{pin!r} must appear exactly once in environment.yml's pip section"
    extra = [ln for ln in pip_lines if ln not in pins and ln != "-e ."]
    assert not extra, f"environment.yml pins things requirements.txt does not: {extra}"
    assert "-e ." in pip_lines, "environment.yml must install the course package (-e .)"
    py = [d for d in deps if isinstance(d, str) and d.startswith("python")]
    assert py == [f"python={sys.version_info.major}.{sys.version_info.minor}"]


def test_the_drift_check_would_notice_a_changed_pin(tmp_path):
    # control: render() really follows requirements.txt (edit a copy and compare)
    module = _generator()
    original = module.ROOT
    try:
        fake = tmp_path / "repo"
        fake.mkdir()
        text = (ROOT / "requirements.txt").read_text().replace("jax==", "jax==0.0.0+", 1)
        (fake / "requirements.txt").write_text(text)
        module.ROOT = fake
        assert module.render() != (ROOT / "environment.yml").read_text()
    finally:
        module.ROOT = original


@pytest.mark.parametrize("dist", ["jax", "jaxlib", "numpy", "matplotlib", "nbgrader", "jupyterlab",
                                  "ipywidgets", "pytest", "hypothesis"])
def test_installed_versions_match_the_pins(dist):
    assert importlib.metadata.version(dist) == _pins()[dist], (
        f"the venv's {dist} differs from requirements.txt (rebuild with `make venv`)"
    )


def test_pyproject_installs_the_helpers_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["where"] == ["helpers"]
    assert (ROOT / "helpers" / "rlhf_lab" / "__init__.py").is_file()


def test_editable_package_imports_from_helpers_anywhere(tmp_path):
    # run from an unrelated folder (like nbgrader's autograded/<student>/) with a clean sys.path
    # ... and `python -m rlhf_lab.lesson_cli` (what `make lesson` runs) resolves there too
    code = (
        "import runpy, sys, rlhf_lab, rlhf_lab.plots\n"
        "print(rlhf_lab.__file__)\n"
        "sys.argv = ['lesson_cli', '--help']\n"
        "runpy.run_module('rlhf_lab.lesson_cli', run_name='__main__', alter_sys=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first_line, help_text = out.stdout.split("\n", 1)
    assert "--out" in help_text, out.stdout
    location = Path(first_line.strip()).resolve()
    assert location == (ROOT / "helpers" / "rlhf_lab" / "__init__.py").resolve()
    assert importlib.metadata.version("rlhf-lab") == project_version()


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_jupyter_stack_starts_without_building_iri_parsers():
    """Every nbgrader command, the pre-flight, Formgrader and JupyterLab import jsonschema's format
    checkers (through nbformat and jupyter-events). jsonschema 4.25+ also imports rfc3987-syntax there,
    which builds Earley parsers (lark) at import: 1-2 s of start-up per process on a 2-core machine.
    The pins keep it out; this fails if a pin change brings it back."""
    probe = ("import sys, nbformat.validator, jupyter_events.validators, nbgrader.apps.autogradeapp; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('rfc3987_syntax', 'lark')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"imported at start-up: {out.stdout.strip()}"
