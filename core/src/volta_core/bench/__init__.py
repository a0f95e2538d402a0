"""``vllm-volta bench``: the kernels a plan names, timed on this machine beside their estimates.

:mod:`~volta_core.bench.cases` lists what to time from a plan (each stage a plugin serves, at
the model's shapes, with the plugin's cost and runnable call for the same work);
:mod:`~volta_core.bench.machine` describes the device and the software;
:mod:`~volta_core.bench.report` pairs each measurement with its estimate and judges each
kernel family; :mod:`~volta_core.bench.run` measures (on a CUDA GPU only).
"""
