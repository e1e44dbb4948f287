"""``python -m kit.pd ...`` = ``kit pd ...``."""
import sys

from kit.cli import main

sys.exit(main(["pd", *sys.argv[1:]]))
