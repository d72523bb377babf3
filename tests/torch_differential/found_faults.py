"""Faults the torch differential campaign found in poptorch, each as its shrunk pytest case.

These cases await fixes in ``poptorch/``: they fail on the current code, so this module is
not collected (its name does not start with ``test_``). Run one with
``python -m pytest tests/torch_differential/found_faults.py::<name>``, or all with
``python -m pytest tests/torch_differential/found_faults.py``. When a fault is fixed, move
its case into a collected test module as a regression test.

Open faults (op / mode, expected vs got; fixed ones are regression tests in
``test_regressions.py``):

* ``test_an_input_written_in_place_with_output_mode_sum``: an inferenceModel whose
  ``forward`` writes its input in place (``x.mul_(2)``), with ``deviceIterations(3)`` and
  ``OutputMode.Sum`` (or ``Final``). Expected: the call returns the sum over the device
  iterations (and, as with ``All``, writes the input back); got: ``RuntimeError: shape
  '[6, 4, 2]' is invalid for input of size 16`` from ``results_input`` in
  ``poptorch/execution/torch_executor.py``: the written-back input is returned in the output
  mode (one micro-batch), but copied into the whole call's input.
* ``test_adamw_with_accumulation_and_replication``: a trainingModel with ``AdamW``
  (``torch.optim`` or ``poptorch.optim``, any ``weight_decay``, even 0, any ``eps``),
  ``gradientAccumulation(2)`` and ``replicationFactor(2)``, one device iteration (with
  ``deviceIterations(2)`` the weights agree). Expected: the weights of one
  AdamW step on the mean gradient of the four micro-batches (as ``Adam``, ``SGD`` and
  ``RMSprop`` do in the same mode, and AdamW does with only one of the two); got: weights
  off by about a third of ``lr`` in every element (fc.weight[0] 0.39567, expected 0.39911,
  for ``lr=0.01, weight_decay=0``: the first step moves each weight by about 0.66 ``lr``
  instead of ``lr``). Found by seed 1011 of ``optim+modes``.
"""

from tests.torch_differential.program import Input, Mode, Spec
from tests.torch_differential.runner import assert_agrees


def test_an_input_written_in_place_with_output_mode_sum():
    """poptorch failed: RuntimeError: shape '[6, 4, 2]' is invalid for input of size 16
    (found by seed 701 of ``structure+modes``)
    """
    source = """
        class Model(torch.nn.Module):
            def forward(self, x):
                x.mul_(2)
                return x + 1
    """
    assert_agrees(
        source,
        [Input("x", Spec((2, 4, 2), "float32"))],
        Mode(device_iterations=3, output_mode="Sum"),
        seed=701,
        families=("structure",),
    )


def test_adamw_with_accumulation_and_replication():
    """state fc.weight: values differ (rtol 0.00012, atol 0.00012)
    (found by seed 1011 of ``optim+modes``)
    """
    source = """
        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(3, 3)
            def forward(self, x):
                loss = poptorch.identity_loss(self.fc(x).square().mean(), reduction="sum")
                return loss
    """
    assert_agrees(
        source,
        [Input("x", Spec((2, 4, 2, 3), "float32"))],
        Mode(
            kind="training",
            optimizer="torch.optim.AdamW(params, lr=0.01, weight_decay=0.0)",
            accumulation=2,
            replicas=2,
        ),
        seed=1011,
        families=("matmul",),
    )
