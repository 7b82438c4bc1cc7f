"""``python -m rkv.cli``: the ``rkv`` command line."""

import sys

from rkv.cli import main

sys.exit(main())
