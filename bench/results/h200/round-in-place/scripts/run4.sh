set -u
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
make setup-erlang compile >/dev/null 2>&1 || echo compile failed
R=$OUT/final2; mkdir -p $R
make test-gpu > $R/test-gpu.log 2>&1; echo "test-gpu rc $?"
grep -E "[0-9]+ passed|tests passed|Failed|FAILED|failed" $R/test-gpu.log | head
tar czf $OUT/final2.tgz -C $OUT final2
