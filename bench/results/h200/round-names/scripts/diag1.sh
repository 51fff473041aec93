set -u
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
nproc; lscpu | grep -E "Model name|MHz" | head -3
for e in 1000 10000; do
  python3 bench/lone_parts.py --backend cuda --slots --profile --elements $e --n 3000 > $OUT/slots-$e.txt 2>&1
  python3 bench/lone_parts.py --backend cuda --profile --elements $e --n 3000 > $OUT/frame-$e.txt 2>&1
  python3 bench/lone_parts.py --backend cpu --slots --elements $e --n 3000 > $OUT/cpu-slots-$e.txt 2>&1
done
tail -n 12 $OUT/slots-1000.txt $OUT/cpu-slots-1000.txt
