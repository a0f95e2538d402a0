# Sourced, from the repository root, by the plugins' one-call GPU scripts after they set `here`
# (the plugin's folder) and `name` (the run's): the logs folder `out` ($OUT, default a fresh
# `mktemp -d`), the sources on PYTHONPATH, the plugin's own Triton cache, the `pytest` command
# (an array) and the device and versions written to $out/device.txt.
out=${OUT:-$(mktemp -d -t "${name}_out.XXXXXX")}
mkdir -p "$out"
echo "logs in $out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}core/src:core/devkit/src:$here/src:$here/tests
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/$here/.tcache
pytest=(python3 -m pytest -p volta_devkit.testing -p no:cacheprovider --rootdir=$here -q)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; from volta_core.kernel_api import nvrtc_version; print("torch", torch.__version__, "triton", triton.__version__, "nvrtc", nvrtc_version())'
} 2>&1 | tee "$out/device.txt"
