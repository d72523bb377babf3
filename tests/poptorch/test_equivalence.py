"""One trainingModel call equals the hand-written explicit program."""

import numpy as np

from .handwritten import handwritten, host_feeds, make_data, poptorch_model

DI, GA, R, MB, LR = 10, 4, 2, 2, 0.01


def test_training_model_matches_handwritten_program():
    x, t = make_data(DI * GA * R * MB)
    session, (xs, ts), weights, loss_stream = handwritten(MB, DI, GA, R, LR)
    xh, th = host_feeds(x, t, DI, GA, R, MB)
    with session:
        for _ in range(2):
            hand_loss = session.run({xs: xh, ts: th})[loss_stream]
        hand = session.get_tensors_data(weights.tensors)
    model = poptorch_model(DI, GA, R, LR)
    for _ in range(2):
        loss = model(x, t)
    assert loss.shape == (DI * GA * R,)
    np.testing.assert_allclose(loss, hand_loss.reshape(-1), rtol=1e-5, atol=1e-6)
    state = model.state_dict()
    for name, var in weights.named_tensors.items():
        np.testing.assert_allclose(state[name], hand[var], rtol=1e-5, atol=1e-6)
    # The weights moved: the comparison is not between two initial states.
    assert np.abs(state["w1"] - _initial_weight("w1")).max() > 1e-3


def _initial_weight(name):
    import poptorch

    from .handwritten import Mlp

    model = poptorch.inferenceModel(Mlp())
    model.compile(*make_data(2))
    return model.state_dict()[name]
