#!/usr/bin/env bash
# Main job: set up .venv, execute every notebook headless on the CPU default and write an HTML report
# (reports/index.html). Pass --lab to open JupyterLab on the executed copies (reports/*.ipynb) afterwards;
# the editable notebooks are notebooks/NN_name.py, paired with notebooks/NN_name.ipynb.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
.venv/bin/python -m kit report "$@"
if [[ " $* " == *" --lab "* ]]; then exec .venv/bin/jupyter lab --notebook-dir=reports; fi
