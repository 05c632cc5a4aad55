# Two commands set everything up on a fresh machine (see README, Quick start):
#   make train   -> installs the package alone into .venv, then runs the main job on its built-in default
#   make test    -> installs the package with the `test` extra into .venv, then runs the whole test suite
# Two install levels, one stamp each: the test level builds on the base level, and either is
# redone when pyproject.toml changes.
VENV ?= .venv
PY := $(VENV)/bin/python
BASE_STAMP := $(VENV)/.installed-base
TEST_STAMP := $(VENV)/.installed-test

.PHONY: venv train test doctor clean

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(BASE_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e .
	touch $@

# torch is pinned (==2.13.0) in the test extra: its CPU build is what these machines hold.
$(TEST_STAMP): pyproject.toml $(BASE_STAMP)
	$(PY) -m pip install -q -e ".[test]"
	touch $@

venv: $(TEST_STAMP)

train: $(BASE_STAMP)
	$(VENV)/bin/jaxpod train

doctor: $(BASE_STAMP)
	$(VENV)/bin/jaxpod launch --hosts 4 -- $(VENV)/bin/jaxpod doctor

# 2 workers, each test file on one of them (module fixtures and launched clusters stay shared): one worker
# alone left a third of 2 cores idle (waiting on launched hosts, compiles). The slowest tests go in every log:
# the suite must stay under 20 min on 2 cores.
test: $(TEST_STAMP)
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --durations=25

clean:
	rm -rf $(VENV) build *.egg-info
