# Entry points. Each bootstraps .venv from requirements.txt when it is missing or stale.
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
# nbgrader calls the bare `alembic` and `jupyter` commands: the venv's bin must come first on PATH.
RUN := PATH="$(VENV)/bin:$$PATH" JAX_PLATFORMS=cpu

.PHONY: venv demo test test-fast test-browser bench release environment.yml lesson

venv:
	@tools/bootstrap.sh

## make demo: the instructor pipeline on the bundled example submissions, printing a grade table
demo: venv
	$(RUN) $(PY) -m rlhf_lab.demo

## make lesson: the lesson's PPO experiment headless (numbers, figure, data + provenance)
lesson: venv
	$(RUN) $(PY) -m rlhf_lab.lesson_cli --out demo_out

## make test: the whole suite, browser tests included
test: venv
	$(RUN) $(PY) -m pytest -q

test-fast: venv
	$(RUN) $(PY) -m pytest -q -m "not slow and not browser and not postgres"

test-browser: venv
	$(RUN) $(PY) -m pytest -q -m browser

bench: venv
	$(RUN) $(PY) bench/bench_trainer.py

environment.yml: requirements.txt
	$(PY) tools/make_environment_yml.py > environment.yml
