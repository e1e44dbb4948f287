"""The ``kit`` command: one argparse tree (:mod:`~kit.cli.main`), ``kit doctor``, the bad-input table and the tiny
models' commands. It imports the layers below it; nothing imports it.
"""
from kit.cli.main import main

__all__ = ["main"]
