"""Graph transforms."""
