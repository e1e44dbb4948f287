#!/usr/bin/env bash
# Main job: set up .venv, execute every notebook headless on the CPU default and write an HTML report
# (reports/index.html). Pass --lab to open JupyterLab on the executed copies (reports/*.ipynb) afterwards;
# the editable notebooks are notebooks/NN_name.py, paired with notebooks/NN_name.ipynb.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
.venv/bin/python -m kit report "$@"
# JupyterLab refuses to start as root unless told (containers and CI run as root); it listens on localhost only.
if [[ " $* " == *" --lab "* ]]; then
  as_root=(); if [ "$(id -u)" = 0 ]; then as_root=(--allow-root); fi
  exec .venv/bin/jupyter lab --notebook-dir=reports ${as_root[@]+"${as_root[@]}"}
fi
