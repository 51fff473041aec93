set -u
T0=$(date +%s)
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
erlc -o /tmp bench/erlcuda_split.erl
use() { rm -rf python/erlcuda && cp -r "$1" python/erlcuda && make compile > /dev/null 2>&1 || echo "compile failed"; }
split() { ERLCUDA_PYTHON=python3 timeout 100 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp -eval 'erlcuda_split:main(), halt().'; }
R=$OUT/ab2; mkdir -p $R
i=0
for side in old new old new; do
  case $side in old) use .scratch/old/python/erlcuda;; new) use .scratch/new/erlcuda;; esac
  i=$(( i + 1 ))
  for n in 1000 10000; do timeout 40 python3 bench/lone_parts.py --slots --backend cuda --elements $n --n 2000 > $R/lone-parts-$n-$i-$side.txt 2>&1; done
  split > $R/split-$i-$side.txt 2>&1
  echo "== $i $side t=$(( $(date +%s) - T0 ))"
  grep -h "worker lone path" $R/lone-parts-*-$i-$side.txt
  grep "go through shared" $R/split-$i-$side.txt | cut -c1-160
  grep "total" $R/split-$i-$side.txt | grep "^ *10000 \|^ *1000 " | grep -v sync
done
timeout 100 bench/bus --quick --out $R/bus > /dev/null 2>&1; echo "bus rc $?"
grep -E "^\| vector_add 1e|^\| reduce 1.6e7|^\| lone" $R/bus/report.md | head -12
grep -E "^\| 1e4 " $R/bus/report.md
echo "t=$(( $(date +%s) - T0 ))"
tar czf $OUT/ab2.tgz -C $OUT ab2
