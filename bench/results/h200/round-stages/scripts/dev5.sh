#!/usr/bin/env bash
for n in 80000 40000 14468; do echo "== $n"; python3 tmpdev/align.py $n; done
