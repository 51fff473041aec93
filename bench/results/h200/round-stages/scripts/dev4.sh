#!/usr/bin/env bash
set -u
O=$OUT/a4; mkdir -p $O
log() { echo "$(date -u +%T) $*" | tee -a $O/log.txt; }
. .gpu-kit/setup.sh >>$O/log.txt 2>&1; export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
[ -d _build/default/lib/erlcuda/ebin ] || { python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl; make setup-erlang compile >>$O/log.txt 2>&1; }
{ lscpu; ls /sys/devices/system/node/; cat /sys/devices/system/node/node*/cpulist; nvidia-smi topo -m; } >$O/topo.txt 2>&1
erlc -o tmpdev tmpdev/erlcuda_split3.erl tmpdev/erlcuda_tpprobe.erl
E="erl -noshell -pa _build/default/lib/erlcuda/ebin -pa tmpdev"
for k in reduce vector_add; do
  TIMELINE=1 KERNEL=$k CALLERS=1000 ERLCUDA_PYTHON=python3 BACKEND=cuda timeout 100 $E -eval 'erlcuda_tpprobe:main(), halt().' 2>&1 | grep -v "REPORT\|^erlcuda:" >>$O/timeline.txt; log "timeline $k $?"
done
H=$(( $(nproc) / 2 - 1 ))
for pin in "" "0-$H" "" "0-$H"; do
  echo "== pin '$pin'" >>$O/split3.txt
  if [ -n "$pin" ]; then P="taskset -c $pin"; else P=""; fi
  THRESH=auto ERLCUDA_PYTHON=python3 BACKEND=cuda timeout 120 $P $E -eval 'erlcuda_split3:main(), halt().' 2>&1 | grep -v "REPORT\|^erlcuda:" >>$O/split3.txt; log "split3 '$pin' $?"
done
cat $O/topo.txt | head -40; cat $O/timeline.txt $O/split3.txt
