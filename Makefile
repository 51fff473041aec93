# erlcuda: `make demo` sets up and runs the four kernels from Erlang; `make test` sets up and
# runs every test. Set-up installs only what is missing: Erlang/OTP, rebar3, Elixir and g++
# (which builds user kernels for the cpu backend) from the OS packages, and numpy, pytest,
# hypothesis and ruff into .venv (which sees the machine's own Python packages) where python3
# lacks them.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
REBAR ?= rebar3
VENV := .venv
PY = $(VENV)/bin/python

.PHONY: demo test test-fast test-gpu test-python test-erlang test-elixir test-release lint bench bench-quick soak soak-memory \
        setup setup-erlang setup-elixir setup-cxx setup-python setup-bench compile clean

# The demo module is not part of the application: compiled into a scratch folder.
demo: setup compile
	@mkdir -p _build/demo
	erlc -o _build/demo -pa _build/default/lib/erlcuda/ebin test/demo/erlcuda_demo.erl
	erl -noshell -pa _build/default/lib/erlcuda/ebin -pa _build/demo \
	  -eval 'erlcuda_demo:main(), halt().'

# The unit tests alone, without worker processes, peer nodes or the GPU: a quick check
# while working (`make test` runs everything).
FAST_EUNIT := erlcuda_jobs_tests,erlcuda_cluster_pick_tests,erlcuda_job_tests,erlcuda_vector_tests,\
  erlcuda_worker_command_tests,erlcuda_protocol_tests,erlcuda_api_tests,erlcuda_config_tests
test-fast: setup compile
	$(PY) -m pytest -q -m "not process and not slow and not gpu" test/python
	$(REBAR) eunit --module=$(subst $(eval) ,,$(FAST_EUNIT))

# Every stage runs, whichever fails; the failures are listed together at the end.
test: setup setup-elixir compile
	MAKE="$(MAKE)" test/stages lint test-python test-erlang test-elixir test-release

# On the GPU machine (`. .gpu-kit/setup.sh` first): the gpu-marked pytest tests and the
# eunit group that runs with backend = cuda; the CPU tests run too.
GPU_PY ?= python3
test-gpu: setup-erlang compile
	ERLCUDA_TEST_GPU=1 $(GPU_PY) -m pytest -m gpu -v test/python
	ERLCUDA_TEST_GPU=1 ERLCUDA_PYTHON=$$(command -v $(GPU_PY)) $(REBAR) eunit --module=erlcuda_gpu_tests,erlcuda_usercode_gpu_tests,erlcuda_doc_examples_tests

setup: setup-erlang setup-cxx setup-python

# Erlang/OTP and rebar3 (and Elixir, for its test) from the OS packages, where missing.
setup-erlang:
	@if ! command -v erl >/dev/null || ! command -v $(REBAR) >/dev/null; then \
	  $(call apt_install,erlang-nox erlang-dev erlang-dialyzer erlang-eunit rebar3); fi

setup-elixir: setup-erlang
	@command -v elixir >/dev/null || $(call apt_install,elixir)

# The C++ compiler the cpu backend builds user kernels with (the one nvcc runs too).
setup-cxx:
	@command -v g++ >/dev/null || $(call apt_install,g++)

# .venv, made with the machine's packages visible (PyCUDA, numpy where installed), and the
# Python tools that are missing installed into it: never into the machine's python.
setup-python:
	@python3 -c 'import ensurepip' 2>/dev/null || $(call apt_install,python3-venv)
	@if [ ! -x $(VENV)/bin/python ]; then \
	  echo "creating $(VENV) (it sees the machine's packages)"; \
	  python3 -m venv --system-site-packages $(VENV); fi
	@$(VENV)/bin/python -c 'import numpy, pytest, hypothesis, ruff, matplotlib, wheel' 2>/dev/null || { \
	  echo "installing numpy, pytest, hypothesis, ruff, matplotlib and wheel into $(VENV)"; \
	  $(VENV)/bin/python -m pip install -q numpy pytest hypothesis ruff matplotlib wheel; }

apt_install = { echo "installing $(1) from the OS packages"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(1) >/dev/null; }

compile:
	$(REBAR) compile

# Where Elixir is installed, the application's ebin holds the Elixir modules too (built by
# erlang/erlcuda_elixir.escript): xref, the cycle check and dialyzer read them with Elixir's
# libraries on the code path (ERL_LIBS: the lib folder beside the bin folder its `elixir`
# script runs from, as that script finds it), dialyzer with the elixir application in its
# PLT (rebar3's `elixir` profile), elixirc compiles them again with warnings as errors,
# and `mix format` checks the Elixir sources' layout (.formatter.exs).
ELIXIR_LIBS = $(shell e=$$(command -v elixir) && cd "$$(dirname "$$(readlink -f "$$e")")/../lib" && pwd)
ELIXIR_SOURCES = $(shell find erlang/elixir -name '*.ex' | sort)

lint:
	$(PY) -m ruff check python test/python bench
	ERL_LIBS="$(ELIXIR_LIBS)" $(REBAR) as test xref
	$(REBAR) compile
	ERL_LIBS="$(ELIXIR_LIBS)" escript test/lint/cycles.escript _build/default/lib/erlcuda/ebin
	escript test/lint/port_writers.escript erlang
	ERL_LIBS="$(ELIXIR_LIBS)" $(REBAR) $(if $(ELIXIR_LIBS),as elixir) dialyzer
	$(if $(ELIXIR_LIBS),out=$$(mktemp -d) && trap 'rm -rf "$$out"' EXIT && \
	  elixirc --warnings-as-errors --ignore-module-conflict -o "$$out" \
	    -pa _build/default/lib/erlcuda/ebin $(ELIXIR_SOURCES))
	$(if $(ELIXIR_LIBS),mix format --check-formatted)

test-python:
	$(PY) -m pytest -q test/python

test-erlang:
	$(REBAR) eunit

test-elixir: setup-elixir compile
	elixir -pa _build/default/lib/erlcuda/ebin -r test/elixir/test_helper.exs \
	  -r "test/elixir/*_test.exs"

# rebar3 and mix releases of small apps that depend on erlcuda, run without the sources.
test-release:
	test/release/run $(PY)

# The benchmarks run under .venv's python, bench script and worker alike (bench/run starts the
# worker with its own interpreter), and write to a new folder under _build/bench/runs/ unless
# told otherwise: `make bench BENCH_ARGS="--out bench/results/h200 --backend cuda"`.
BENCH_ARGS ?=

bench: setup compile setup-bench
	BENCH_PYTHON=$(VENV)/bin/python bench/run --full $(BENCH_ARGS)

bench-quick: setup compile setup-bench
	BENCH_PYTHON=$(VENV)/bin/python bench/run --quick $(BENCH_ARGS)

# matplotlib and tqdm (the plots and progress bars) into .venv, never the machine's python.
setup-bench: setup-python
	@$(VENV)/bin/python -c 'import numpy, matplotlib, tqdm' 2>/dev/null || { \
	  echo "installing numpy, matplotlib and tqdm into $(VENV)"; \
	  $(VENV)/bin/python -m pip install -q numpy matplotlib tqdm; }

soak: setup compile
	bench/soak $${SOAK_SECONDS:-120}

soak-memory: setup compile
	bench/soak --memory $${SOAK_SECONDS:-600}

clean:
	rm -rf _build $(VENV)
