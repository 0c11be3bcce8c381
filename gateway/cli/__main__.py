"""``python -m gateway.cli``: same as the ``gateway`` console script."""

import sys

from gateway.cli import main

sys.exit(main())
