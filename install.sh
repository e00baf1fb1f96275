#!/usr/bin/env bash
# Install nccl-tune (editable) into the current Python environment.
#
#   ./install.sh            the tool
#   ./install.sh --test     the tool and what the test suite needs
#   ./install.sh --plot     ... and matplotlib for --plot
#
# torch: an installed torch (a CUDA build, say) is always kept. Without one, a machine
# with an NVIDIA driver gets torch from the package index as usual, and a machine
# without a GPU gets the CPU build (torch==2.13.0, which on this workplace's machines
# lies on disk; elsewhere set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# to avoid the multi-GB CUDA wheel).
set -euo pipefail
cd "$(dirname "$0")"
py=${PYTHON:-python3}
extras=()
for arg in "$@"; do
  case "$arg" in
    --test) extras+=(test) ;;
    --plot) extras+=(plot) ;;
    --sglang) extras+=(sglang) ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

if "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "install.sh: keeping torch $("$py" -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "install.sh: GPU found, installing torch from the package index"
  "$py" -m pip install -q 'torch>=2.3'
else
  echo "install.sh: no GPU found, installing the CPU build of torch"
  "$py" -m pip install -q 'torch==2.13.0'
fi

spec="."
if [ ${#extras[@]} -gt 0 ]; then
  spec=".[$(IFS=,; echo "${extras[*]}")]"
fi
"$py" -m pip install -q -e "$spec"
echo "install.sh: done ($("$py" -m nccl_tune --version))"
