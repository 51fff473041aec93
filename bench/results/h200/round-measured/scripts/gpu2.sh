set -u
. .gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/graph-site .gpu-kit/wheels-graphs/*.whl
export PYTHONPATH=/tmp/graph-site${PYTHONPATH:+:$PYTHONPATH}
make setup-erlang compile > /dev/null 2>&1 || echo compile failed
python3 .scratch/open_time.py > $OUT/open-time.txt 2>&1; echo "open rc $?"; cat $OUT/open-time.txt
for n in 1000 10000; do timeout 60 python3 bench/lone_parts.py --slots --backend cuda --elements $n --n 3000 > $OUT/lone-parts-slots-$n.txt 2>&1; echo "lone_parts $n rc $?"; head -12 $OUT/lone-parts-slots-$n.txt; done
for n in 1000 10000; do timeout 60 python3 .scratch/slot_pieces.py cuda $n > $OUT/slot-pieces-$n.txt 2>&1; cat $OUT/slot-pieces-$n.txt; done
timeout 60 python3 bench/lone_parts.py --slots --backend cuda --elements 10000 --n 5000 --profile > $OUT/lone-parts-profile.txt 2>&1; echo "profile rc $?"
erlc -o /tmp bench/erlcuda_split.erl bench/erlcuda_hops.erl
ERLCUDA_PYTHON=python3 timeout 120 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp -eval 'erlcuda_split:main(), halt().' > $OUT/split.txt 2>&1; echo "split rc $?"; grep "total\|sync gap" $OUT/split.txt | head -30
timeout 90 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp -eval 'erlcuda_hops:main(), halt().' > $OUT/hops.txt 2>&1; echo "hops rc $?"; cat $OUT/hops.txt
