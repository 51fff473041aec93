set -u
T0=$(date +%s)
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
erlc -o /tmp bench/erlcuda_split.erl
use() { rm -rf python/erlcuda && cp -r "$1" python/erlcuda && make compile > /dev/null 2>&1 || echo "compile failed"; }
split() { ERLCUDA_PYTHON=python3 timeout 100 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp -eval 'erlcuda_split:main(), halt().'; }
R=$OUT/ab; mkdir -p $R
for side in new old new old; do
  use .scratch/$side/erlcuda
  i=$(( ${i:-0} + 1 ))
  timeout 40 python3 bench/lone_parts.py --slots --backend cuda --elements 10000 --n 2000 > $R/lone-parts-$i-$side.txt 2>&1
  split > $R/split-$i-$side.txt 2>&1
  timeout 100 bench/bus --quick --out /tmp/bus-$i > /dev/null 2>&1; cp /tmp/bus-$i/report.md $R/bus-$i-$side.md
  echo "== $i $side t=$(( $(date +%s) - T0 ))"
  grep "worker lone path" $R/lone-parts-$i-$side.txt
  grep "go through shared" $R/split-$i-$side.txt | cut -c1-160
  grep "total" $R/split-$i-$side.txt | grep "^ *10000\|^ *1000 " | head -6
  grep -E "^\| vector_add 1e4|^\| 1e4 " $R/bus-$i-$side.md
  grep -A5 "Chosen at the application" $R/bus-$i-$side.md | grep "bytes"
done
tar czf $OUT/ab.tgz -C $OUT ab
