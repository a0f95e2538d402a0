#!/usr/bin/env bash
# The compute_70 PTX cases (pytest -k ptx70) need a CUDA 12 NVRTC: CUDA 13 dropped Volta, and the
# GPU machine has only CUDA 13. This builds, on a machine with network access, a bundle the GPU
# call carries (ignored folder .ptx70/, about 40 MB): cuda-bindings 12.9 for the GPU machine's
# Python and CUDA 12.9's NVRTC libraries, xz-compressed. From the repository root:
#   PY=3.12 bash scripts/ptx70_bundle.sh                # PY: the GPU machine's Python (3.12)
# and on the GPU machine, before the ptx70 tests (run: carry [".ptx70"]):
#   source scripts/ptx70_bundle.sh use                  # unpacks to ~/.cache/vllm-volta/ptx70, sets PYTHONPATH, LD_LIBRARY_PATH
bundle=.ptx70
if [ "${1:-}" = use ]; then  # sourced: leaves the caller's shell options alone
  dest=${PTX70_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-volta/ptx70}
  mkdir -p "$dest/site" "$dest/lib"
  tar -xJf "$bundle/site.tar.xz" -C "$dest/site"
  for lib in libnvrtc.so.12 libnvrtc-builtins.so.12.9; do xz -dc "$bundle/$lib.xz" > "$dest/lib/$lib"; done
  # cuda-pathfinder (which cuda-bindings asks for NVRTC) prefers a CUDA 13 NVRTC installed in
  # site-packages (torch's) over LD_LIBRARY_PATH, but takes one already loaded: every Python
  # started with this PYTHONPATH loads the bundle's CUDA 12 NVRTC first.
  printf '%s\n' "import ctypes" "ctypes.CDLL('$dest/lib/libnvrtc.so.12', mode=ctypes.RTLD_GLOBAL)" \
    > "$dest/site/sitecustomize.py"
  export PYTHONPATH=$dest/site${PYTHONPATH:+:$PYTHONPATH}
  export LD_LIBRARY_PATH=$dest/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  return 0 2>/dev/null || exit 0
fi
set -euo pipefail
py=${PY:-3.12}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip_download=(python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64
  --platform manylinux2014_x86_64 -d "$tmp/wheels")
"${pip_download[@]}" --python-version "$py" "cuda-bindings==12.9.*" "cuda-pathfinder>=1.1,<2"
"${pip_download[@]}" --python-version "$py" "nvidia-cuda-nvrtc-cu12==12.9.*"
mkdir -p "$tmp/site" "$tmp/nvrtc" "$bundle"
for whl in "$tmp"/wheels/cuda_*.whl; do python3 -m zipfile -e "$whl" "$tmp/site"; done
python3 -m zipfile -e "$tmp"/wheels/nvidia_cuda_nvrtc_cu12-*.whl "$tmp/nvrtc"
tar -cJf "$bundle/site.tar.xz" -C "$tmp/site" .
for lib in libnvrtc.so.12 libnvrtc-builtins.so.12.9; do
  xz -6 -T0 -c "$tmp/nvrtc/nvidia/cuda_nvrtc/lib/$lib" > "$bundle/$lib.xz"
done
du -sh "$bundle"
