# erlcuda: `make demo` sets up and runs the four kernels from Erlang; `make test` sets up and
# runs every test. Set-up installs only what is missing: Erlang/OTP, rebar3 and Elixir from the
# OS packages, and numpy, pytest and hypothesis into .venv where python3 lacks them.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
REBAR ?= rebar3
VENV := .venv
PY = $(shell [ -x $(VENV)/bin/python ] && echo $(VENV)/bin/python || echo python3)

.PHONY: demo test test-gpu test-python test-erlang test-elixir lint bench bench-quick soak \
        setup setup-erlang setup-elixir setup-python compile clean

demo: setup compile
	erl -noshell -pa _build/default/lib/erlcuda/ebin -eval 'erlcuda_demo:main(), halt().'

test: setup setup-elixir compile lint test-python test-erlang test-elixir

# On the GPU machine (`. .gpu-kit/setup.sh` first): the gpu-marked pytest tests and the
# eunit group that runs with backend = cuda; the CPU tests run too.
test-gpu: setup-erlang compile
	ERLCUDA_TEST_GPU=1 $(PY) -m pytest -m gpu -v test/python
	ERLCUDA_TEST_GPU=1 ERLCUDA_PYTHON=$$(command -v $(PY)) $(REBAR) eunit --module=erlcuda_gpu_tests

setup: setup-erlang setup-python

# Erlang/OTP and rebar3 (and Elixir, for its test) from the OS packages, where missing.
setup-erlang:
	@if ! command -v erl >/dev/null || ! command -v $(REBAR) >/dev/null; then \
	  $(call apt_install,erlang-nox erlang-dev erlang-dialyzer erlang-eunit rebar3); fi

setup-elixir: setup-erlang
	@command -v elixir >/dev/null || $(call apt_install,elixir)

# The machine's python3 where it already has numpy, pytest and hypothesis (a GPU machine
# with its own PyCUDA, say); else a virtual environment in .venv with them installed.
setup-python:
	@if [ ! -x $(VENV)/bin/python ] && ! python3 -c 'import numpy, pytest, hypothesis' 2>/dev/null; then \
	  echo "creating $(VENV) with numpy, pytest and hypothesis"; \
	  python3 -m venv $(VENV) && $(VENV)/bin/python -m pip install -q numpy pytest hypothesis; fi

apt_install = { echo "installing $(1) from the OS packages"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(1) >/dev/null; }

compile:
	$(REBAR) compile

lint:
	@$(PY) -m ruff --version >/dev/null 2>&1 || $(PY) -m pip install -q ruff
	$(PY) -m ruff check python test/python bench
	$(REBAR) as test xref
	$(REBAR) dialyzer

test-python:
	$(PY) -m pytest -q test/python

test-erlang:
	$(REBAR) eunit

test-elixir:
	elixir -pa _build/default/lib/erlcuda/ebin test/elixir/erlcuda_test.exs

bench: setup compile
	$(PY) -c 'import matplotlib, tqdm' 2>/dev/null || $(PY) -m pip install -q matplotlib tqdm \
	  || echo "bench: matplotlib/tqdm not installed: no plots, a plain progress counter"
	BENCH_PYTHON=$(PY) bench/run --full

bench-quick: setup compile
	$(PY) -c 'import matplotlib, tqdm' 2>/dev/null || $(PY) -m pip install -q matplotlib tqdm \
	  || echo "bench: matplotlib/tqdm not installed: no plots, a plain progress counter"
	BENCH_PYTHON=$(PY) bench/run --quick

soak: setup compile
	bench/soak $${SOAK_SECONDS:-120}

clean:
	rm -rf _build $(VENV)
