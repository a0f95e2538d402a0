"""A plugin written for a host API this host does not speak (2.0)."""

from volta_core import hookimpl
from volta_core.host.types import ReasoningParserSpec

VOLTA_HOST_API = "2.0"


@hookimpl
def volta_reasoning_parsers() -> list[ReasoningParserSpec]:
    return [ReasoningParserSpec("test-future", "volta_test_future_api:Parser")]
