set -u
step=$1
R=/tmp/round-inplace
if [ "$step" = start ]; then
  mkdir -p $R
  ( . .gpu-kit/setup.sh >/dev/null 2>&1; python3 bench/zero_copy.py > $R/zero-copy.txt 2>&1; echo "zero_copy rc $?" )
  RUNS=2 SOAK_S=600 bash bench/gpu-round start $R
else
  bash bench/gpu-round collect $R
fi
cat $R/round.txt
tar czf $OUT/round-$step.tgz -C /tmp round-inplace
