# Two commands set up and test Astra on a fresh machine:
#   make setup   # virtualenv in .venv with Astra, its dependencies and Ray (CPU torch unless TORCH= is given)
#   make test    # ruff (pyflakes, import order), then the test suite on every core (pytest-xdist, one
#                # test file per worker at a time; GPU tests skip cleanly without CUDA)
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TVM_FFI ?= 0.1.11
PY := $(VENV)/bin/python

.PHONY: setup test test-gpu clean

setup:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH),$(PY) -m pip install -q "$(TORCH)")
	$(PY) -m pip install -q -e '.[dev,ray]'
	# the tvm-ffi that SGLang 0.5.23 (the default tree) pins: its headers and library go into every build
	$(PY) -m pip install -q "apache-tvm-ffi==$(TVM_FFI)"
	$(VENV)/bin/astra --help > /dev/null

test:
	$(VENV)/bin/ruff check astra harness tests scripts
	$(PY) -m pytest -q -ra -n auto --dist loadfile

test-gpu:
	$(PY) -m pytest -q -ra -m gpu

clean:
	rm -rf $(VENV) .astra-test-home .pytest_cache
