#!/usr/bin/env bash
# The session's last loan, call 1: two probes, then bench/gpu-round start (RUNS=3, 600 s soak started), then a wait
set -u
O=$OUT/r; mkdir -p $O
( . .gpu-kit/setup.sh >/dev/null 2>&1
  python3 tmpdev/align.py 80000 >$O/pipe-alignment-80000.txt 2>&1
  python3 bench/lone_parts.py --backend cuda --elements 10000 --n 2000 >$O/lone-parts-1e4.txt 2>&1 )
RUNS=3 SOAK_S=600 bench/gpu-round start $O
sleep 45
cd $OUT && tar czf r1.tgz r && rm -rf r
