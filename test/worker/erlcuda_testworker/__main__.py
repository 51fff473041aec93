"""``python -m erlcuda_testworker serve ...``: the worker with the test calls."""

import sys

from erlcuda import cli

from . import CALLS

sys.exit(cli.main(sys.argv[1:], extensions=CALLS))
