#!/usr/bin/env bash
# Loan A, call 2 (same machine): throughput x2 with the collector logged, split2 again, bus quick
set -u
O=$OUT/a2; mkdir -p $O/gclog-1 $O/gclog-2
log() { echo "$(date -u +%T) $*" | tee -a $O/log.txt; }

. .gpu-kit/setup.sh >>$O/log.txt 2>&1; export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
uptime >>$O/log.txt
for i in 1 2; do
  GCLOG_DIR=$O/gclog-$i PYTHONPATH=$PYTHONPATH:$PWD/bench/gclog BENCH_PYTHON=python3 timeout 150 bench/run --quick --backend cuda --only throughput --out $O/tp-$i >$O/tp-$i.log 2>&1; log "tp $i $?"
done
ERLCUDA_PYTHON=python3 BACKEND=cuda timeout 120 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa tmpdev -eval 'erlcuda_split2:main(), halt().' >$O/split2.txt 2>&1; log "split2 $?"
BENCH_PYTHON=python3 timeout 150 bench/bus --backend cuda --quick --out $O/bus-q2 >$O/bus-q2.log 2>&1; log "bus q2 $?"
uptime >>$O/log.txt
cd $OUT && tar czf a2.tgz a2 && rm -rf a2
