"""bench/kernel_profile.py: kernels summed by kind, per call, without the host's events."""

from __future__ import annotations

from bench.kernel_profile import completion_times, kernel_table


def _event(name: str, dur: float, ph: str = "X") -> dict:
    return {"ph": ph, "name": name, "dur": dur}


def test_kernels_are_summed_by_kind_per_call_and_host_events_left_out():
    events = [
        _event("dot.3", 3000.0),
        _event("dot", 1000.0),
        _event("dot.12", 2000.0),
        _event("copy_bitcast_fusion.5", 500.0),
        _event("copy_bitcast_fusion", 1500.0),
        _event("while", 100.0),
        _event("ThunkExecutor::Execute", 9000.0),
        _event("PjitFunction(step)", 9500.0),
        _event("SlinkyThreadPool::Await", 300.0),
        _event("ThreadpoolListener::Record", 0.01),
        _event("end: ynn_fusion.2", 10.0),
        _event("$session.py:484 run", 9900.0),
        _event("dot.4", 7000.0, ph="i"),  # not a complete event
    ]
    rows = kernel_table(events, calls=2)
    assert rows == [("dot", 3.0, 1.5), ("copy_bitcast_fusion", 1.0, 1.0), ("while", 0.05, 0.5)]
    by_name = dict((name, ms) for name, ms, _ in kernel_table(events, calls=2, by_name=True))
    assert by_name == {
        "dot.3": 1.5,
        "dot": 0.5,
        "dot.12": 1.0,
        "copy_bitcast_fusion.5": 0.25,
        "copy_bitcast_fusion": 0.75,
        "while": 0.05,
    }


def test_completion_runs_from_each_kernel_start_to_its_end_mark():
    def at(name: str, ts: float, dur: float = 0.0) -> dict:
        return {"ph": "X", "name": name, "ts": ts, "dur": dur}

    events = [
        at("dot.1", 0.0, 100.0),  # launched; its work done at 900
        at("copy_fusion.2", 150.0, 50.0),
        at("end: copy_fusion.2", 200.0),
        at("end: dot.1", 899.0, 1.0),
        at("dot.1", 1000.0, 100.0),  # the second call's dot: its own mark
        at("dot.7", 1100.0, 100.0),  # no end mark: not counted
        at("end: dot.1", 1500.0),
        at("$session.py:484 run", 0.0, 2000.0),
    ]
    assert completion_times(events, calls=2) == {"dot": 0.7, "copy_fusion": 0.025}
    by_name = completion_times(events, calls=2, by_name=True)
    assert by_name == {"dot.1": 0.7, "copy_fusion.2": 0.025}
