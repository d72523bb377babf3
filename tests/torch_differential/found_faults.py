"""Faults the torch differential campaign found in poptorch, each as its shrunk pytest case.

These cases await fixes in ``poptorch/``: they fail on the current code, so this module is
not collected (its name does not start with ``test_``). Run one with
``python -m pytest tests/torch_differential/found_faults.py::<name>``, or all with
``python -m pytest tests/torch_differential/found_faults.py``. When a fault is fixed, move
its case into a collected test module as a regression test.

Open faults (op / mode, expected vs got): none. Fixed ones are regression tests in
``test_regressions.py``.
"""
