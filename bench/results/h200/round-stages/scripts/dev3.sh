#!/usr/bin/env bash
set -u
O=$OUT/a3; mkdir -p $O
log() { echo "$(date -u +%T) $*" | tee -a $O/log.txt; }
. .gpu-kit/setup.sh >>$O/log.txt 2>&1; export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
[ -d _build/default/lib/erlcuda/ebin ] || { python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl; make setup-erlang compile >>$O/log.txt 2>&1; }
erlc -o tmpdev tmpdev/erlcuda_split3.erl
for t in huge auto huge auto; do
  echo "== THRESH=$t" >>$O/split3.txt
  THRESH=$t ERLCUDA_PYTHON=python3 BACKEND=cuda timeout 120 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa tmpdev -eval 'erlcuda_split3:main(), halt().' 2>&1 | grep -v "REPORT\|^erlcuda:" >>$O/split3.txt; log "split3 $t $?"
done
cat $O/split3.txt
erlc -o tmpdev tmpdev/erlcuda_tpprobe.erl
for k in reduce vector_add; do
  KERNEL=$k CALLERS=1000 ERLCUDA_PYTHON=python3 BACKEND=cuda timeout 100 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa tmpdev -eval 'erlcuda_tpprobe:main(), halt().' 2>&1 | grep -v "REPORT\|^erlcuda:" >>$O/tpprobe.txt; log "tpprobe $k $?"
done
KERNEL=reduce CALLERS=100 ERLCUDA_PYTHON=python3 BACKEND=cuda timeout 100 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa tmpdev -eval 'erlcuda_tpprobe:main(), halt().' 2>&1 | grep -v "REPORT\|^erlcuda:" >>$O/tpprobe.txt; log "tpprobe 100 $?"
cat $O/tpprobe.txt
