"""Capture of ``torch.nn`` models into popxl graphs: export, repeated blocks, translation."""
