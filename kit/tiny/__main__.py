"""``python -m kit.tiny``: see :mod:`kit.tiny.cli`."""
import sys

from .cli import main

sys.exit(main())
