"""``python -m erlcuda_benchworker serve ...``: the worker with the benchmark calls."""

import sys

from erlcuda import cli

from . import CALLS

sys.exit(cli.main(sys.argv[1:], extensions=CALLS))
