#!/bin/sh
# Build step (rebar.config's pre_hooks): erlang/erlcuda_contract.erl and .hrl, written from
# python/erlcuda/contract.json by the worker's own reader of it (python/erlcuda/contract.py),
# so that both sides read one declaration. It needs a Python 3: $ERLCUDA_PYTHON where set
# (the worker's), else python3 on the PATH.
python="${ERLCUDA_PYTHON:-python3}"
if ! command -v "$python" >/dev/null 2>&1; then
    cat >&2 <<MESSAGE
erlcuda: building needs Python 3, and $python was not found (on the PATH: $PATH).
The build writes erlang/erlcuda_contract.erl from python/erlcuda/contract.json with it,
and the worker runs on it (Python 3.10 or later, with numpy). Install it, then build again:
  Debian/Ubuntu: sudo apt-get install python3 python3-venv
  Fedora: sudo dnf install python3    macOS: brew install python
or point ERLCUDA_PYTHON at a Python 3 interpreter.
MESSAGE
    exit 1
fi
exec "$python" python/erlcuda/contract.py --erlang erlang/erlcuda_contract.erl \
    --erlang-header erlang/erlcuda_contract.hrl
