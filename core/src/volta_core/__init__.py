"""vllm-volta core: the host that makes vLLM serve well on NVIDIA V100 (SM70) through plugins.

Importing this package imports neither torch, triton nor vllm: the command-line tool plans for
a V100 on any machine, and vLLM loads the host in every process at start-up.
"""

from volta_core.device import V100, Device, parse_device
from volta_core.hookspecs import hookimpl
from volta_core.manager import (
    ENTRY_POINT_GROUP,
    HOST_API_VERSION,
    PluginRecord,
    PluginStatus,
    VoltaPluginManager,
    get_plugin_manager,
)

__version__ = "0.4.0"

__all__ = [
    "ENTRY_POINT_GROUP",
    "HOST_API_VERSION",
    "V100",
    "Device",
    "PluginRecord",
    "PluginStatus",
    "VoltaPluginManager",
    "get_plugin_manager",
    "hookimpl",
    "parse_device",
]
