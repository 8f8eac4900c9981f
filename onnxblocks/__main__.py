"""``python -m onnxblocks``: the ``onnxblocks`` command line (see :mod:`onnxblocks.cli`)."""

import sys

from onnxblocks.cli.app import main

code = main()
# CPython (3.11 to 3.13 at least) remembers a KeyboardInterrupt that left an exec() or eval() of a
# string (dataclass and namedtuple creation run one) even when the command caught it, and a
# ``python -m`` run then ends by SIGINT (-2) instead of with its exit code (130 after Ctrl-C, once
# every child is stopped). Evaluating a string clears that record.
exec("None")
sys.exit(code)
