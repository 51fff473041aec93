# A/B of the slots' name check (38a5141's erlcuda_shm_slots against the tree's) on one machine
set -u
R=$OUT/ab; mkdir -p $R
exec > >(tee -a $R/log.txt) 2>&1
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl 2>/dev/null
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
make setup-erlang compile >/dev/null 2>&1; echo "compile $?"
EB=_build/default/lib/erlcuda/ebin
mkdir -p /tmp/old-ebin /tmp/new-ebin
erlc -o /tmp/old-ebin tmpdev/old/erlcuda_shm_slots.erl && cp $EB/erlcuda_shm_slots.beam /tmp/new-ebin/
erlc -o /tmp bench/erlcuda_hops.erl bench/erlcuda_split.erl
nproc; uptime
use() { cp /tmp/$1-ebin/erlcuda_shm_slots.beam $EB/; }
for r in 1 2; do
  for v in new old; do
    use $v
    erl -noshell -pa $EB -pz /tmp -eval 'erlcuda_hops:main(), halt().' > $R/hops-$v-$r.txt 2>&1
    ERLCUDA_PYTHON=python3 erl -noshell -pa $EB -pz /tmp -eval 'erlcuda_split:main(), halt().' > $R/split-$v-$r.txt 2>&1
    echo "$(date -u +%T) hops/split $v $r"
  done
done
for v in new old; do
  use $v
  BENCH_PYTHON=python3 bench/bus --backend cuda --out $R/bus-full-$v > $R/bus-full-$v.log 2>&1
  echo "$(date -u +%T) bus full $v $?"
done
use new
grep -h "1e4\|1e5" $R/bus-full-*/report.md | head -8
for f in $R/hops-*; do echo "== $f"; grep -E "^ +10000|^ +1000 " $f; done
for f in $R/split-*; do echo "== $f"; grep -E "^ +10000 +(shm|pipe)" $f; done
