"""A plugin whose import fails, to prove the host isolates it."""

raise ImportError("volta_test_broken is broken on purpose")
