"""``python -m onnxblocks``: the ``onnxblocks`` command line (see :mod:`onnxblocks.cli`)."""

import sys

from onnxblocks.cli.app import main

sys.exit(main())
