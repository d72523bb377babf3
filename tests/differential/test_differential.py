"""A bounded, seeded sample of the differential campaign: every program must agree with the
reference. (The long campaign: ``python -m tests.differential.campaign --seconds N``.)"""

import pytest

from . import reference, reference_extras
from . import shrink as shrink_module
from .campaign import FEATURE_SETS
from .generator import generate
from .program import count_nodes
from .runner import Outcome, batches, check, check_batch
from .shrink import describe, shrink

PROGRAMS_PER_SET = 36
# Sets whose programs compile slowly (multi-device placement, pipelines, many gradient
# graphs) run fewer programs, keeping the sample under three minutes on two cores.
SLOW_SETS = {"addons": 24, "placement": 24, "pipeline": 16, "all": 24}
BATCH = 12


def _count(features: tuple[str, ...]) -> int:
    key = "all" if len(features) > 1 else features[0]
    return SLOW_SETS.get(key, PROGRAMS_PER_SET)


@pytest.mark.parametrize("features", FEATURE_SETS, ids="+".join)
def test_random_programs_agree_with_the_reference(features):
    base = 10_000 * (FEATURE_SETS.index(features) + 1)
    programs = [generate(base + i, features) for i in range(_count(features))]
    for batch in batches(programs, BATCH):
        found = check_batch(batch)
        if found:
            pytest.fail("disagreement with the reference:\n" + describe(shrink(found[0], check)))


def test_a_wrong_reference_is_caught_and_shrunk(monkeypatch):
    monkeypatch.setitem(reference.BINARY, "add", lambda xp, a, b: a + b + 1)
    programs = [generate(seed, ("call",)) for seed in range(12)]
    found = check_batch(programs)
    assert found, "a reference with a wrong `add` went unnoticed"
    small = shrink(found[0], check)
    assert count_nodes(small.program) <= count_nodes(found[0].program)
    assert count_nodes(small.program) <= 4
    text = describe(small)
    assert "= add(" in text and "Add." in text  # the generator's notation and the schedule


def _wrong_shard(full, rank, size):
    return _right_shard(full, size - 1 - rank, size)


_right_shard = reference_extras.shard_of


@pytest.mark.parametrize(
    ("features", "name", "wrong"),
    [
        (("rts",), "shard_of", _wrong_shard),
        (("remote",), "_remote_store", lambda self, node, envs: None),
    ],
    ids=["rts-shard-order", "remote-store-dropped"],
)
def test_a_wrong_remote_rule_is_caught(monkeypatch, features, name, wrong):
    owner = reference_extras if name == "shard_of" else reference_extras.ExtraRules
    monkeypatch.setattr(owner, name, wrong)
    programs = [generate(seed, features) for seed in range(16)]
    assert any(check_batch(b) for b in batches(programs, BATCH)), f"a wrong {name} went unnoticed"


def test_shrinking_keeps_the_failure_and_a_buildable_program(monkeypatch):
    """A smaller program counts only if PopXL builds it and it fails the same way: a crash
    does not reproduce a wrong value, and an edit PopXL refuses is no reproduction at all."""
    original = generate(3, ("call",))
    wrong = Outcome(original, "output v1: values differ:\n  got  [0.]\n  want [1.]")
    crash = "session failed:\nTraceback ...\nValueError: bad program"
    shrunk = shrink(wrong, lambda p: Outcome(p, crash))
    assert shrunk.program is original  # every candidate crashed: none reproduces the value

    real_build = shrink_module.build_programs

    def refuse_smaller(programs):
        if count_nodes(programs[0]) < count_nodes(original):
            raise ValueError("refused")
        return real_build(programs)

    monkeypatch.setattr(shrink_module, "build_programs", refuse_smaller)
    assert shrink(wrong, lambda p: Outcome(p, wrong.message)).program is original
    monkeypatch.undo()
    smallest = shrink(wrong, lambda p: Outcome(p, wrong.message)).program
    assert count_nodes(smallest) < count_nodes(original)
