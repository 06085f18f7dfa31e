"""python -m specgram.check_model PATH ...: see the package's docstring."""

import sys

from . import main

sys.exit(main())
