# Entry points. Each bootstraps .venv from requirements.txt when it is missing or stale.
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
# nbgrader calls the bare `alembic` and `jupyter` commands: the venv's bin must come first on PATH.
RUN := PATH="$(VENV)/bin:$$PATH" JAX_PLATFORMS=cpu

backup: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.operations.backup

## make lms-export LMS=canvas|moodle [OUT=file]: the gradebook in the LMS's gradebook import CSV (default
## grades_<LMS>.csv): Canvas by the roster's lms_user_id, Moodle by e-mail; students the LMS could not
## identify and scores still waiting for a grader are named on stderr (rlhf_lab.instructor.operations.lms_export)
LMS ?= canvas
lms-export: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.operations.lms_export --format "$(LMS)" --out "$(or $(OUT),grades_$(LMS).csv)"

.PHONY: backup lms-export venv demo test test-fast test-browser bench release examples generated check-generated environment.yml lesson lab lint pairs normalise

venv:
	@tools/bootstrap.sh

## make demo: the instructor pipeline on the bundled example submissions, printing a grade table; in a
## scratch copy of the course (course_run/, gitignored): the course's gradebook, exchange and outputs are
## not touched. DEMO_ARGS: options of rlhf_lab.demo, e.g. DEMO_ARGS="--workers 1" or "--progress"
DEMO_ARGS ?=
demo: venv
	$(RUN) $(PY) -m rlhf_lab.demo $(DEMO_ARGS)

## make lesson: the lesson's PPO experiment headless (numbers, figure, data + provenance)
lesson: venv
	$(RUN) $(PY) -m rlhf_lab.lesson_cli --out demo_out

## make test: the whole suite, browser tests included. The fast tests run on two processes (one per
## core, pytest-xdist, a file per process at a time); the class runs, browser and PostgreSQL tests
## after them, also on two processes, in groups (`--dist loadscope` with the grouping in
## tests/conftest.py: the bundled class's tests one group, the hostile class one module, the
## 100-seed answer checks one test each, every other module its own). Both parts always run.
FAST := not slow and not browser and not postgres
test: venv
	@status=0; \
	$(RUN) $(PY) -m pytest -q -n 2 --dist loadfile -m "$(FAST)" || status=$$?; \
	$(RUN) $(PY) -m pytest -q -n 2 --dist loadscope --durations=20 -m "not ($(FAST))" || status=$$?; \
	exit $$status

test-fast: venv
	$(RUN) $(PY) -m pytest -q -n 2 --dist loadfile -m "$(FAST)"

test-browser: venv
	$(RUN) $(PY) -m pytest -q -m browser

bench: venv
	$(RUN) $(PY) bench/bench_trainer.py
	$(RUN) $(PY) bench/bench_explorer.py
	$(RUN) $(PY) bench/bench_pipeline.py
	$(RUN) $(PY) bench/bench_parallel.py
	$(RUN) $(PY) bench/bench_sequences.py
	$(RUN) $(PY) bench/bench_judge.py
	$(RUN) $(PY) bench/bench_demo.py

## Authoring: the notebooks in source/ are what instructors edit (in JupyterLab: `make lab`).
## Each is paired with a py:percent text file under content/ (jupytext.toml); `make lint` checks the
## course's rules. Generated from them: release/ (nbgrader generate_assignment), example and hostile
## submissions (from release + the recipes). `make generated` rebuilds all in order.
## LAB_ARGS: extra options for `jupyter lab` in `make lab` and `make student-lab`, e.g. LAB_ARGS=--allow-root
## (Jupyter refuses to run as root without it; both targets stop first and say so) or LAB_ARGS=--no-browser.
LAB_ARGS ?=
define check_root
@if [ "$$(id -u)" = 0 ] && ! printf '%s\n' $(LAB_ARGS) | grep -qx -- '--allow-root'; then \
  echo "make $@: you are root, and Jupyter refuses to start as root without --allow-root:" >&2; \
  echo "  make $@ LAB_ARGS=--allow-root   (better: run it as an ordinary user)" >&2; exit 2; fi
endef

lab: venv
	$(check_root)
	JUPYTER_CONFIG_DIR=$(CURDIR)/jupyter/instructor $(RUN) $(VENV)/bin/jupyter lab --ServerApp.root_dir=$(CURDIR) $(LAB_ARGS)

lint: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.authoring lint

pairs: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.authoring pairs

normalise: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.authoring normalise

release: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.authoring normalise
	$(RUN) $(PY) tools/make_release.py

examples: venv
	$(RUN) $(PY) tools/make_examples.py
	$(RUN) $(PY) tools/make_hostile.py

generated: pairs release examples

check-generated: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.authoring lint
	$(RUN) $(PY) -m rlhf_lab.instructor.authoring pairs --check
	$(RUN) $(PY) tools/make_release.py --check
	$(RUN) $(PY) tools/make_examples.py --check
	$(RUN) $(PY) tools/make_hostile.py --check

environment.yml: requirements.txt
	$(PY) tools/make_environment_yml.py > environment.yml

## Running a class (README "Instructors" / "Students"): the course's nbgrader exchange, the roster,
## the grader's guides, and JupyterLab as a student sees it.
LAB_PORT ?= 8888
.PHONY: exchange roster guides check-guides student-lab

## make exchange: create the exchange (<course>/exchange or $RLHF_EXCHANGE) with the permissions nbgrader expects
exchange: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.operations.exchange init

## make roster: check roster.csv (or ROSTER=path, or $RLHF_ROSTER) and import it with nbgrader db student import;
## without any of them it says so (the example class's roster is examples/roster.csv)
roster: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.operations.roster $(ROSTER)

## make guides: rewrite the grader's guides guides/<assignment>.md from source/
guides: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.operations.guide

check-guides: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.operations.guide --check

## make student-lab STUDENT=<id>: JupyterLab for one roster student (ROSTER=..., else $RLHF_ROSTER, roster.csv,
## examples/roster.csv; other ids refused) in a private home $(STUDENT_HOMES)/<id> (0700: nbgrader's cache, the
## lab workspace and settings); submits as <id>; nothing is written into the repository. On a server, `make hub`.
STUDENT_HOMES ?= $(HOME)/rlhf-students
student-lab: venv
	$(check_root)
	@if [ -z "$(STUDENT)" ]; then echo "make student-lab: say who the student is: make student-lab STUDENT=<id from the roster>" >&2; exit 2; fi
	$(RUN) $(PY) -m rlhf_lab.instructor.operations.student_lab "$(STUDENT)" --homes "$(STUDENT_HOMES)" $(if $(ROSTER),--roster "$(ROSTER)") -- --port=$(LAB_PORT) $(LAB_ARGS)

## make student-lib: (re)build the students' copy of rlhf_lab ($RLHF_STUDENT_LIB, default /srv/rlhf-student-lib):
## what the released notebooks use, without the hidden checks, the instructor tooling or the tasks' references
student-lib: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.operations.student_library build

## A class on one server (README "Students" / "Instructors"): JupyterHub with a Linux account per student.
## make hub-users: the roster's accounts (ROSTER=path), the instructor's, the course root and the exchange (root)
## make hub: JupyterHub for the course on http://127.0.0.1:$(HUB_PORT)/ (root; make hub-users first)
HUB_PORT ?= 8000
.PHONY: hub hub-users student-lib bench-hub
hub-users: venv
	$(RUN) $(PY) -m rlhf_lab.instructor.operations.hub users $(ROSTER)
hub: venv
	HUB_PORT=$(HUB_PORT) $(RUN) $(PY) -m rlhf_lab.instructor.operations.hub serve $(ROSTER)

## make bench-hub: the hub under N = 1, 5, 20 students at once (as root: a throw-away class of real
## accounts, removed afterwards) -> bench/results/hub.md
bench-hub: venv
	$(RUN) $(PY) bench/bench_hub.py

## make bench-peer: our sequence-level PPO beside a PyTorch peer (TRL's PPO trainer tried first) on the
## same task; optional, not in CI. Ours runs from .venv, the peer from its own .venv-peer (pins in
## bench/requirements-peer.txt), rebuilt only when missing or when the pins' hash changed.
PEER_VENV := $(CURDIR)/.venv-peer
.PHONY: bench-peer
bench-peer: venv
	@want=$$(sha256sum bench/requirements-peer.txt | cut -d' ' -f1); \
	have=$$(cat "$(PEER_VENV)/.pins-sha256" 2>/dev/null || true); \
	if [ ! -x "$(PEER_VENV)/bin/python" ] || [ "$$want" != "$$have" ]; then \
	  echo "bench-peer: building .venv-peer from bench/requirements-peer.txt" >&2; \
	  [ -x "$(PEER_VENV)/bin/python" ] || $${PYTHON:-python3} -m venv "$(PEER_VENV)" || exit 1; \
	  "$(PEER_VENV)/bin/python" -m pip install --quiet -r bench/requirements-peer.txt || exit 1; \
	  echo "$$want" > "$(PEER_VENV)/.pins-sha256"; \
	fi
	$(RUN) $(PY) bench/bench_peer.py --peer-python "$(PEER_VENV)/bin/python"
