"""Variable-update ops (in place on their first argument)."""
