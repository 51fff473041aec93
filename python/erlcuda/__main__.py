import sys

from . import boot

# First: under Erlang, whatever goes wrong from here on (numpy missing, a usage error)
# reaches Erlang's logger, not the node's console.
boot.capture(sys.argv[1:])

from .cli import main  # noqa: E402

sys.exit(main())
