#!/usr/bin/env bash
# Main job: set up .venv, execute every notebook headless on the CPU default and write an HTML report
# (reports/index.html). Pass --lab to open JupyterLab afterwards instead of exiting.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
.venv/bin/python -m kit report "$@"
if [[ " $* " == *" --lab "* ]]; then exec .venv/bin/jupyter lab --notebook-dir=notebooks; fi
