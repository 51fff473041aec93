# erlcuda: `make demo` sets up and runs the four kernels from Erlang; `make test` sets up and
# runs every test. Set-up installs what is missing: Erlang/OTP, rebar3 and Elixir from the OS
# packages, and the Python packages into .venv (which sees the machine's own packages, so a
# GPU machine's PyCUDA is used where present).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
REBAR ?= rebar3
VENV := .venv
PY = $(shell [ -x $(VENV)/bin/python ] && echo $(VENV)/bin/python || echo python3)
export ERL_FLAGS ?= +S 4

.PHONY: demo test test-gpu test-python test-erlang test-elixir lint bench bench-quick soak \
        setup setup-erlang setup-python compile clean

demo: setup compile
	$(REBAR) shell --apps erlcuda --eval 'erlcuda_demo:main(), init:stop().' 2>&1 \
	  | grep -v -e '^Eshell' -e '^===>' -e '^[0-9]*>' -e '^$$'

test: setup compile lint test-python test-erlang test-elixir

# On the GPU machine (`. .gpu-kit/setup.sh` first): the gpu-marked pytest tests and the
# eunit group that runs with backend = cuda; the CPU tests run too.
test-gpu: setup-erlang compile
	ERLCUDA_TEST_GPU=1 $(PY) -m pytest -m gpu -v test/python
	ERLCUDA_TEST_GPU=1 ERLCUDA_PYTHON=$$(command -v $(PY)) $(REBAR) eunit --module=erlcuda_gpu_tests

setup: setup-erlang setup-python

setup-erlang:
	@if ! command -v erl >/dev/null || ! command -v $(REBAR) >/dev/null || ! command -v elixir >/dev/null; then \
	  echo "installing Erlang/OTP, rebar3 and Elixir from the OS packages"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    erlang-nox erlang-dev erlang-dialyzer erlang-eunit rebar3 elixir >/dev/null; \
	fi

setup-python: $(VENV)/.done

$(VENV)/.done: pyproject.toml
	python3 -m venv --system-site-packages $(VENV)
	$(VENV)/bin/python -m pip install -q numpy pytest hypothesis ruff
	touch $@

compile:
	$(REBAR) compile

lint:
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
	bench/run --full

bench-quick: setup compile
	bench/run --quick

soak: setup compile
	bench/soak $${SOAK_SECONDS:-120}

clean:
	rm -rf _build $(VENV)
