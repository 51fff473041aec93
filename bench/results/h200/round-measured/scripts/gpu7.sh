set -u
T0=$(date +%s)
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
make setup-erlang compile > /dev/null 2>&1 || echo "compile failed"
git log --oneline -1 2>/dev/null
R=$OUT/final2; mkdir -p $R
timeout 280 make test-gpu > $R/test-gpu.log 2>&1; echo "test-gpu rc $? t=$(( $(date +%s) - T0 ))"
grep -E "[0-9]+ passed|tests passed|Failed|FAILED|failed|badmatch" $R/test-gpu.log | head
