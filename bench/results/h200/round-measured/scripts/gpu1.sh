set -u
T0=$(date +%s)
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
make setup-erlang compile > $OUT/setup.log 2>&1 || echo compile failed
echo "setup done $(( $(date +%s) - T0 )) s"
python3 -m pytest -q -p no:cacheprovider test/python/test_cuda_backend.py -k "in_place or strided" > $OUT/pytest-in-place.txt 2>&1; echo "pytest rc $?"; tail -3 $OUT/pytest-in-place.txt
timeout 90 python3 bench/zero_copy.py --rounds 4 --n 100 > $OUT/zero-copy.txt 2>&1; echo "zero_copy rc $?"; head -8 $OUT/zero-copy.txt
echo "t $(( $(date +%s) - T0 )) s"
timeout 100 bench/bus --quick --out /tmp/bus > /tmp/bus.log 2>&1; echo "bus rc $?"; cp /tmp/bus/report.md $OUT/bus-report.md 2>/dev/null; grep -E "^\| vector_add 1e|^\| reduce|^\| lone" /tmp/bus/report.md | head -14
echo "t $(( $(date +%s) - T0 )) s"
timeout 330 make test-gpu > $OUT/test-gpu.log 2>&1; echo "test-gpu rc $?"
grep -E "[0-9]+ passed|tests passed|Failed|FAILED|failed|Error" $OUT/test-gpu.log | head
echo "t $(( $(date +%s) - T0 )) s"
