#!/usr/bin/env bash
# Loan A, call 1: setup, split2, bus quick, bus full
set -u
O=$OUT/a1; mkdir -p $O
log() { echo "$(date -u +%T) $*" | tee -a $O/log.txt; }
. .gpu-kit/setup.sh >>$O/log.txt 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl >>$O/log.txt 2>&1
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
make setup-erlang compile >>$O/log.txt 2>&1; log "compile $?"
nproc >>$O/log.txt; uptime >>$O/log.txt
erlc -o tmpdev tmpdev/erlcuda_split2.erl
ERLCUDA_PYTHON=python3 BACKEND=cuda timeout 120 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa tmpdev -eval 'erlcuda_split2:main(), halt().' >$O/split2.txt 2>&1; log "split2 $?"
BENCH_PYTHON=python3 timeout 150 bench/bus --backend cuda --quick --out $O/bus-q1 >$O/bus-q1.log 2>&1; log "bus q1 $?"
BENCH_PYTHON=python3 timeout 330 bench/bus --backend cuda --out $O/bus-full >$O/bus-full.log 2>&1; log "bus full $?"
uptime >>$O/log.txt
cd $OUT && tar czf a1.tgz a1 && rm -rf a1
