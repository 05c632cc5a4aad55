# Two commands set everything up on a fresh machine (see README, Quick start):
#   make train   -> installs into .venv, then runs the main job on its built-in default
#   make test    -> installs into .venv, then runs the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv train test doctor clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned (==2.13.0) in the dev extra: its CPU build is what these machines hold.
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/jaxpod train

doctor: $(STAMP)
	$(VENV)/bin/jaxpod launch --hosts 4 -- $(VENV)/bin/jaxpod doctor

test: $(STAMP)
	$(VENV)/bin/pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
