set -u
T0=$(date +%s)
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
erlc -o /tmp .scratch/erl/order_check.erl
use() { rm -rf python/erlcuda && cp -r "$1" python/erlcuda && make compile > /dev/null 2>&1 || echo "compile failed"; }
oc() { ERLCUDA_BACKEND=cuda ERLCUDA_PYTHON=python3 timeout 150 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp -eval 'order_check:main(20), halt().' 2>&1 | grep -v "NOTICE\|started\|go through\|REPORT" | tail -4; }
R=$OUT/order; mkdir -p $R
for side in new old new old; do
  case $side in old) use .scratch/old/python/erlcuda;; new) use .scratch/new/erlcuda;; esac
  echo "== $side t=$(( $(date +%s) - T0 ))"; oc | tee -a $R/order-$side.txt
done
use .scratch/new/erlcuda
for i in 1 2; do ERLCUDA_TEST_GPU=1 ERLCUDA_PYTHON=python3 timeout 100 rebar3 eunit --module=erlcuda_gpu_tests > $R/eunit-$i.log 2>&1; echo "eunit $i rc $?"; grep -E "Failed:|passed|badmatch" $R/eunit-$i.log | head -3; done
echo "t=$(( $(date +%s) - T0 ))"
