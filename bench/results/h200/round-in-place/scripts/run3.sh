set -u
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
R=$OUT/final; mkdir -p $R
python3 -m pytest -q -p no:cacheprovider test/python/test_cuda_backend.py > $R/pytest-cuda.txt 2>&1; echo "pytest rc $?"; tail -3 $R/pytest-cuda.txt
python3 bench/zero_copy.py > $R/zero-copy.txt 2>&1; echo "zero_copy rc $?"; cat $R/zero-copy.txt
tar czf $OUT/final.tgz -C $OUT final
