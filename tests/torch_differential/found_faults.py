"""Faults the torch differential campaign found in poptorch, each as its shrunk pytest case.

These cases await fixes in ``poptorch/``: they fail on the current code, so this module is
not collected (its name does not start with ``test_``). Run one with
``python -m pytest tests/torch_differential/found_faults.py::<name>``, or all with
``python -m pytest tests/torch_differential/found_faults.py``. When a fault is fixed, move
its case into a collected test module as a regression test.

Faults (op / mode, expected vs got):

* ``test_weight_decay_skips_parameters_forward_never_uses``: a trainingModel with
  ``torch.optim.AdamW(weight_decay=0.1)`` (also ``SGD``/``Adam`` with ``weight_decay``)
  and a submodule ``forward`` never calls. torch's optimisers skip a parameter whose
  ``grad`` is None, so the unused weights stay as they were; poptorch decays them
  (each weight is multiplied by ``1 - lr * weight_decay`` per step).
"""

from tests.torch_differential.program import Input, Mode, Spec
from tests.torch_differential.runner import assert_agrees


def test_weight_decay_skips_parameters_forward_never_uses():
    """state unused.weight: values differ (rtol 0.00012, atol 0.00012):
    got  [0.1353359967470169, -0.12420070171356201, ...]
    want [0.13547146320343018, -0.12432502955198288, ...]
    (found by seed 6 of ``structure+optim``)
    """
    source = """
        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(3, 2)
                self.unused = torch.nn.Linear(3, 3)
            def forward(self, x):
                y = self.fc(x)
                loss = poptorch.identity_loss(y.square().mean(), reduction="mean")
                return {"loss": loss}
    """
    assert_agrees(
        source,
        [Input("x", Spec((2, 3), "float32"))],
        Mode(
            kind="training",
            optimizer="torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, eps=1e-2)",
        ),
        seed=6,
        families=("matmul",),
    )
