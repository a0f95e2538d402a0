"""``vllm-volta doctor``: the serving machine's checks (:mod:`~volta_core.doctor.checks`) and
the reader of the CUDA fatbins in vLLM's and torch's compiled extensions
(:mod:`~volta_core.doctor.fatbin`)."""
