set -u
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
make setup-erlang compile >/dev/null 2>&1 || echo compile failed
R=$OUT/r1; mkdir -p $R
python3 bench/zero_copy.py > $R/zero-copy.txt 2>&1; echo "zero_copy rc $?"; cat $R/zero-copy.txt
python3 -m pytest -q -p no:cacheprovider test/python/test_cuda_backend.py > $R/pytest-cuda.txt 2>&1; echo "pytest rc $?"; tail -3 $R/pytest-cuda.txt
erlc -o /tmp bench/erlcuda_split.erl
split() { ERLCUDA_PYTHON=python3 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp -eval 'erlcuda_split:main(), halt().' ; }
date; split > $R/split-new-1.txt 2>&1; date
cp python/erlcuda/backends/cuda/device.py /tmp/new-device.py
cp tmpdev/old-device.py python/erlcuda/backends/cuda/device.py; make compile >/dev/null 2>&1
split > $R/split-old-1.txt 2>&1
cp /tmp/new-device.py python/erlcuda/backends/cuda/device.py; make compile >/dev/null 2>&1
grep -h "total" $R/split-*.txt | grep "^ *10000\|^ *1000 " 
tar czf $OUT/r1.tgz -C $OUT r1
date; BENCH_PYTHON=python3 bench/bus --backend cuda --quick --out $R/bus-1 > $R/bus-1.log 2>&1; echo "bus rc $?"
grep -A12 "^| target" $R/bus-1/report.md | head -20
tar czf $OUT/r1.tgz -C $OUT r1
