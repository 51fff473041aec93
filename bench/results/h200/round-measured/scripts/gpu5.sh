set -u
T0=$(date +%s)
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
make setup-erlang compile > /dev/null 2>&1 || echo "compile failed"
R=$OUT/final; mkdir -p $R
timeout 40 python3 bench/zero_copy.py --rounds 2 --n 50 1000 10000 > $R/zero-copy.txt 2>&1; head -5 $R/zero-copy.txt
timeout 300 make test-gpu > $R/test-gpu.log 2>&1; echo "test-gpu rc $? t=$(( $(date +%s) - T0 ))"
grep -E "[0-9]+ passed|tests passed|Failed|FAILED|failed" $R/test-gpu.log | head
for i in 1 2; do timeout 100 bench/bus --quick --out $R/bus-$i > /dev/null 2>&1; echo "bus $i rc $?"; rm -f $R/bus-$i/bus.png
  grep -E "^\| vector_add 1e|^\| reduce 1.6e7|^\| lone" $R/bus-$i/report.md | cut -c1-150; grep -E "^\| 1e4 " $R/bus-$i/report.md; done
echo "t=$(( $(date +%s) - T0 ))"
timeout 120 bench/run --quick --backend cuda --only throughput --out $R/throughput > $R/throughput.log 2>&1; echo "throughput rc $?"
grep -iE "1000 callers|jobs/s|250,000|hold" $R/throughput/report.md | head -8
rm -f $R/throughput/*.png
echo "t=$(( $(date +%s) - T0 ))"
tar czf $OUT/final.tgz -C $OUT final
