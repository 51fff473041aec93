# the device calls that followed ab.sh (each its own call, the machine kept warm)
ls /root/out/ab >/dev/null 2>&1 && tar czf $OUT/ab.tgz -C /root/out ab; mkdir -p /tmp/rnd; RUNS=2 SOAK_S=600 bench/gpu-round start /tmp/rnd/round; tar czf $OUT/round-start.tgz -C /tmp/rnd round
mkdir -p /tmp/rnd; bench/gpu-round collect /tmp/rnd/round; tar czf $OUT/round-collect.tgz -C /tmp/rnd round   # ran past its 600 s as the soak ended; called again, it returned at once
