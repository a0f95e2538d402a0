"""Test-only plugins that answer hooks with values of the wrong type."""
