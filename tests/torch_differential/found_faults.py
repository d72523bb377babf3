"""Faults the torch differential campaign found in poptorch, each as its shrunk pytest case.

Cases kept here await fixes in ``poptorch/``: they fail on the current code, so this module is
not collected (its name does not start with ``test_``). Run one with
``python -m pytest tests/torch_differential/found_faults.py::<name>``, or all with
``python -m pytest tests/torch_differential/found_faults.py``. When a fault is fixed, move
its case into ``test_regressions.py``; the campaign counts a program that fails the way a
kept case does apart (``runner.KNOWN_FAULTS``).

Open faults: none (every fault found so far is a regression test in ``test_regressions.py``).
"""
