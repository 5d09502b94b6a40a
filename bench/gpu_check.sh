#!/usr/bin/env bash
# One GPU check, at most 5 minutes on one GPU: every stage's CUDA path (fp32, bf16 and fp16 finite and near fp32;
# DP-SGD; the distributed engine with gloo on CUDA tensors) and bench/study_scale.py's table, written to one
# findings file (bench/gpu_check.py says what each check does).
#
#   bench/gpu_check.sh --prepare            here, with the registry: the pure-Python wheels the GPU machine lacks
#                                           (lpips, torch-fidelity, opacus, fedcli's typer) into .whl/
#   bench/gpu_check.sh [FINDINGS]           on the GPU machine, .whl carried: installs fedcli and those wheels
#                                           beside its own torch, then checks (default: $OUT/gpu-check-findings.txt)
#   bench/gpu_check.sh --dry-run [FINDINGS] [--inject-nan STEP]
#                                           on a CPU, with this checkout's environment: the same logic at bf16,
#                                           without the study table; exits 1 if a step gives a NaN
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--prepare" ]]; then
    versions=$(.venv/bin/python -m pip freeze | grep -iE '^(typer|lpips|torch[-_]fidelity|opacus)==')
    .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: -d .whl $versions
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    ls .whl
    exit 0
fi

if [[ "${1:-}" == "--dry-run" ]]; then
    shift
    findings="${1:-gpu-check-findings.txt}"
    [[ $# -gt 0 ]] && shift
    exec "${PYTHON:-.venv/bin/python}" bench/gpu_check.py --dry-run --findings "$findings" "$@"
fi

findings="${1:-${OUT:-.}/gpu-check-findings.txt}"
site=/tmp/fedcli-site
python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$site" .whl/*.whl
export PYTHONPATH="$site:$PWD"  # fedcli from this tree, beside the machine's own torch
timeout 300 python3 bench/gpu_check.py --findings "$findings"
