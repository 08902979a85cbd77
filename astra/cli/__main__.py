"""`python -m astra.cli`: the same as the `astra` command."""

import sys

from astra.cli import main

sys.exit(main())
