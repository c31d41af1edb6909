# Entry points. Each bootstraps .venv from requirements.txt when it is missing or stale.
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
# nbgrader calls the bare `alembic` and `jupyter` commands: the venv's bin must come first on PATH.
RUN := PATH="$(VENV)/bin:$$PATH" JAX_PLATFORMS=cpu

backup: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.backup

.PHONY: backup venv demo test test-fast test-browser bench release examples sources generated check-generated environment.yml lesson

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
	$(RUN) $(PY) -m pytest -q --durations=20

test-fast: venv
	$(RUN) $(PY) -m pytest -q -m "not slow and not browser and not postgres"

test-browser: venv
	$(RUN) $(PY) -m pytest -q -m browser

bench: venv
	$(RUN) $(PY) bench/bench_trainer.py
	$(RUN) $(PY) bench/bench_explorer.py
	$(RUN) $(PY) bench/bench_pipeline.py
	$(RUN) $(PY) bench/bench_parallel.py

## Generated files: source notebooks (from tools/build_source_*.py), release/ (nbgrader generate_assignment),
## example and hostile submissions (from release + source). `make generated` rebuilds all in order.
sources: venv
	$(RUN) $(PY) tools/build_source_ppo_rlhf.py
	$(RUN) $(PY) tools/build_source_ppo_objective.py

release: venv
	$(RUN) $(PY) tools/make_release.py

examples: venv
	$(RUN) $(PY) tools/make_examples.py
	$(RUN) $(PY) tools/make_hostile.py

generated: sources release examples

check-generated: venv
	$(RUN) $(PY) tools/build_source_ppo_rlhf.py --check
	$(RUN) $(PY) tools/build_source_ppo_objective.py --check
	$(RUN) $(PY) tools/make_release.py --check
	$(RUN) $(PY) tools/make_examples.py --check
	$(RUN) $(PY) tools/make_hostile.py --check

environment.yml: requirements.txt
	$(PY) tools/make_environment_yml.py > environment.yml
