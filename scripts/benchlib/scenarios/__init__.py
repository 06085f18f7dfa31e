"""One module per scenario of scripts/bench.py. Each has a docstring (its first line is the scenario's
one-line help, the rest what it measures and its commands), SHARED (the shared options it takes, with its
defaults), QUICK (what --quick sets), optionally add_options(parser) (its own options) and ENGINE = False
(no --model / --threads), and run(args) (returns an exit status or None). Modules import only the standard
library and benchlib at import time."""
