"""What core's ``pytest11`` entry point (``volta_kernels``) loads: the kernel-test plugin.

The entry point names this module rather than :mod:`volta_core.kernels.testing` itself, so that
``-p volta_core.kernels.testing`` (the spelling that works where the package is only on
``PYTHONPATH``, as on the GPU machine) also works where the entry point is installed: pytest
loads a ``pytest_plugins`` entry once, however many ways it is asked for.
"""

pytest_plugins = ["volta_core.kernels.testing"]
