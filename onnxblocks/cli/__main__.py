"""``python -m onnxblocks.cli``: the same as the ``onnxblocks`` command."""

import sys

from onnxblocks.cli.app import main

sys.exit(main())
