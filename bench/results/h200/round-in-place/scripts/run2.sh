set -u
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
make setup-erlang compile >/dev/null 2>&1 || echo compile failed
R=$OUT/ab; mkdir -p $R
python3 -m pytest -q -p no:cacheprovider test/python/test_cuda_backend.py > $R/pytest-cuda.txt 2>&1; echo "pytest rc $?"; tail -2 $R/pytest-cuda.txt
erlc -o /tmp bench/erlcuda_split.erl
cp python/erlcuda/backends/cuda/device.py /tmp/new-device.py
use() { cp $1 python/erlcuda/backends/cuda/device.py; make compile >/dev/null 2>&1; }
split() { ERLCUDA_PYTHON=python3 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp -eval 'erlcuda_split:main(), halt().' ; }
for i in 1 2; do
  use tmpdev/old-device.py; split > $R/split-old-$i.txt 2>&1
  python3 bench/lone_parts.py --backend cuda --slots > $R/lone-parts-slots-old-$i.txt 2>&1
  use /tmp/new-device.py; split > $R/split-new-$i.txt 2>&1
  python3 bench/lone_parts.py --backend cuda --slots > $R/lone-parts-slots-new-$i.txt 2>&1
done
for i in 1 2; do
  use tmpdev/old-device.py; BENCH_PYTHON=python3 bench/bus --backend cuda --quick --out $R/bus-old-$i > $R/bus-old-$i.log 2>&1
  use /tmp/new-device.py; BENCH_PYTHON=python3 bench/bus --backend cuda --quick --out $R/bus-new-$i > $R/bus-new-$i.log 2>&1
done
for f in $R/split-*.txt; do echo "== $f"; grep "total" $f | grep "^ *10000\|^ *1000 "; done
for f in $R/lone-parts-slots-*.txt; do echo "== $f"; head -3 $f; done
for f in $R/bus-*/report.md; do echo "== $f"; grep "1e3: p50\|1e4: p50\|lone 1000" $f; grep "^| vector_add | 1e4\|^| 1e4" $f; done
for i in 1 2; do
  use tmpdev/old-device.py; BENCH_PYTHON=python3 bench/run --quick --backend cuda --only throughput --out $R/tp-old-$i > $R/tp-old-$i.log 2>&1
  use /tmp/new-device.py; BENCH_PYTHON=python3 bench/run --quick --backend cuda --only throughput --out $R/tp-new-$i > $R/tp-new-$i.log 2>&1
done
for f in $R/tp-*/report.md; do echo "== $f"; grep -i "callers" $f | head -8; done
use /tmp/new-device.py
tar czf $OUT/ab.tgz -C $OUT ab
