# The 100-caller dip after the frozen heap, A/B on one machine: the tree as it is (frozen)
# against the same tree with portenv.settle_heap's gc.freeze() taken out (not frozen), in turn
set -u
R=/tmp/gcab; mkdir -p $R
exec > >(tee -a $R/log.txt) 2>&1
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl 2>/dev/null
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
cp python/erlcuda/portenv.py /tmp/portenv-frozen.py
sed 's/^    gc.freeze()$/    pass  # A\/B: not frozen/' /tmp/portenv-frozen.py > /tmp/portenv-thawed.py
cmp -s /tmp/portenv-frozen.py /tmp/portenv-thawed.py && { echo "sed changed nothing"; exit 1; }
nproc; uptime
for r in 1 2 3; do
  for v in frozen thawed; do
    cp /tmp/portenv-$v.py python/erlcuda/portenv.py
    make setup-erlang compile >/dev/null 2>&1
    grep -c "gc.freeze()" _build/default/lib/erlcuda/priv/python/erlcuda/portenv.py
    BENCH_PYTHON=python3 bench/run --quick --backend cuda --only throughput --out $R/$v-$r > $R/$v-$r.log 2>&1
    echo "$(date -u +%T) $v $r $?"
    grep -E "^\| (vector_add|reduce) \| (100|1000) \|" $R/$v-$r/report.md | head -4
    rm -rf $R/$v-$r/raw; tar czf $OUT/gcab.tgz -C /tmp gcab
  done
done
cp /tmp/portenv-frozen.py python/erlcuda/portenv.py
rm -rf $R/*/raw
tar czf $OUT/gcab.tgz -C /tmp gcab
