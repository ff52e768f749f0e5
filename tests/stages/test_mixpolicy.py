"""The feedback policies' math against one-at-a-time references, over random runs;
their config refused by field and value."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsdata.config import LoaderConfig
from fmsdata.errors import ConfigError
from fmsdata.stages.doremi import DoReMi
from fmsdata.stages.mixpolicy import checked_state, checked_weights, make_policy
from fmsdata.stages.odm import OnlineDataMixing


def odm_one_at_a_time(start, steps, smoothing, fixed):
    """ODM (Albalak et al. 2023, Algorithm 1, over every dataset with tokens), in scalar
    arithmetic, one dataset at a time."""
    k = len(start)
    total = sum(start)
    prior = [w / total for w in start]
    estimates = [0.0] * k
    weights = list(prior)
    out = []
    for t, (losses, tokens) in enumerate(steps, start=1):
        for d in range(k):
            if tokens[d] > 0 and weights[d] > 0:
                estimates[d] = smoothing * estimates[d] + (1 - smoothing) * losses[d] / weights[d]

        def rate(u):
            return fixed if fixed is not None else min(1 / k, math.sqrt(math.log(k) / (k * u)))

        logits = [
            math.log(prior[d]) + rate(t) * estimates[d] if prior[d] > 0 else -math.inf
            for d in range(k)
        ]
        top = max(logits)
        exps = [math.exp(z - top) for z in logits]
        weights = [(1 - k * rate(t + 1)) * e / sum(exps) + rate(t + 1) for e in exps]
        out.append(weights)
    return out


def doremi_one_at_a_time(start, steps, reference, eta, c):
    """DoReMi (Xie et al. 2023, Algorithm 1) per dataset, in scalar arithmetic."""
    k = len(start)
    alpha = [w / sum(start) for w in start]
    out = []
    for losses, tokens in steps:
        raised = [
            alpha[d] * math.exp(eta * max(losses[d] - reference[d], 0.0) if tokens[d] > 0 else 0)
            for d in range(k)
        ]
        alpha = [(1 - c) * a / sum(raised) + c / k for a in raised]
        out.append(alpha)
    return out


def runs(k):
    """Per update: each dataset's mean loss, and its tokens (0: no tokens, loss nan)."""
    step = st.tuples(
        st.lists(st.floats(0.0, 12.0), min_size=k, max_size=k),
        st.lists(st.sampled_from([0, 1, 50, 4096]), min_size=k, max_size=k),
    )
    return st.lists(step, min_size=1, max_size=12)


@st.composite
def odm_cases(draw):
    k = draw(st.integers(1, 4))
    start = draw(st.lists(st.floats(0.05, 10.0), min_size=k, max_size=k))
    smoothing = draw(st.sampled_from([0.0, 0.5, 0.9]))
    fixed = draw(st.one_of(st.none(), st.floats(0.01, 1.0 / k)))
    return start, draw(runs(k)), smoothing, fixed


def masked(losses, tokens):
    return np.where(np.asarray(tokens) > 0, losses, np.nan)


@settings(max_examples=150, deadline=None)
@given(odm_cases())
def test_odm_follows_the_one_at_a_time_reference(case):
    start, steps, smoothing, fixed = case
    policy = OnlineDataMixing([f"d{i}" for i in range(len(start))], start, smoothing, fixed)
    expected = odm_one_at_a_time(start, steps, smoothing, fixed)
    weights = np.asarray(start) / sum(start)
    for (losses, tokens), want in zip(steps, expected):
        got = policy.update(masked(losses, tokens), np.asarray(tokens, float), weights)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        assert math.isclose(sum(got), 1.0, rel_tol=1e-12)
        weights = np.asarray(got)
        # The state saved and loaded continues the same.
        again = OnlineDataMixing([f"d{i}" for i in range(len(start))], start, smoothing, fixed)
        again.load_state_dict(checked_state("odm", policy.state_dict()))
        assert again.state_dict() == policy.state_dict()


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4).flatmap(lambda k: st.tuples(
    st.lists(st.floats(0.05, 10.0), min_size=k, max_size=k),
    runs(k),
    st.lists(st.floats(0.0, 8.0), min_size=k, max_size=k),
    st.floats(0.1, 3.0),
    st.sampled_from([0.0, 1e-3, 0.2]),
)))  # fmt: skip
def test_doremi_follows_the_one_at_a_time_reference(case):
    start, steps, reference, eta, c = case
    policy = DoReMi([f"d{i}" for i in range(len(start))], start, reference, eta, c)
    expected = doremi_one_at_a_time(start, steps, reference, eta, c)
    for (losses, tokens), want in zip(steps, expected):
        got = policy.update(masked(losses, tokens), np.asarray(tokens, float), np.ones(len(start)))
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_odm_moves_towards_the_higher_loss():
    policy = OnlineDataMixing(["a", "b"], [1, 1], 0.0, 0.05)
    weights = np.array([0.5, 0.5])
    for _ in range(10):
        weights = np.asarray(policy.update(np.array([8.0, 1.0]), np.ones(2), weights))
    assert weights[0] > 0.6


MIX = {"data_path": "/d", "datasets": ["a", "b"]}


@pytest.mark.parametrize(
    "overrides, field, value",
    [
        ({"mix_policy": "bandit"}, "mix_policy", "'bandit'"),
        ({"mix_policy": "a b:C"}, "mix_policy", "'a b:C'"),
        ({"mix_policy": 3}, "mix_policy", "3"),
        ({"mix_update_every": 0}, "mix_update_every", "0"),
        ({"mix_update_every": "often"}, "mix_update_every", "'often'"),
        ({"odm_smoothing": 1.0}, "odm_smoothing", "1.0"),
        ({"odm_exploration": 0.6}, "odm_exploration", "0.6"),
        ({"odm_exploration": 0}, "odm_exploration", "0"),
        ({"doremi_step_size": -1}, "doremi_step_size", "-1"),
        ({"doremi_smoothing": 2}, "doremi_smoothing", "2"),
        ({"doremi_reference_losses": [1, "x"]}, "doremi_reference_losses", "'x'"),
        ({"doremi_reference_losses": [1, -2]}, "doremi_reference_losses", "-2"),
        ({"doremi_reference_losses": [1, 2, 3]}, "doremi_reference_losses", "[1.0, 2.0, 3.0]"),
        ({"mix_policy": "doremi"}, "doremi_reference_losses", "None"),
        ({"mix_policy": "odm", "mix_policy_options": {"x": 1}}, "mix_policy_options", "{'x': 1}"),
        ({"mix_policy": "m:C", "mix_policy_options": [1]}, "mix_policy_options", "[1]"),
        (
            {"mix_policy": "odm", "weight_schedule": [[0, [1, 1]]]},
            "weight_schedule",
            "mix_policy='odm'",
        ),
    ],
)
def test_bad_feedback_config_is_refused_by_field_and_value(overrides, field, value):
    with pytest.raises(ConfigError) as caught:
        LoaderConfig(**{**MIX, **overrides})
    assert field in str(caught.value) and value in str(caught.value)


def test_bad_policy_output_and_state_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"mix_policy='m:P' returned \[1, -1\]"):
        checked_weights("m:P", [1, -1], 2)
    with pytest.raises(ConfigError, match="no positive weight"):
        checked_weights("m:P", [0, 0], 2)
    with pytest.raises(ConfigError, match="expected 2"):
        checked_weights("m:P", [1], 2)
    with pytest.raises(ConfigError, match="plain JSON"):
        checked_state("m:P", {"x": float("nan")})
    with pytest.raises(ConfigError, match="plain JSON"):
        checked_state("m:P", {"x": object()})
    mix = LoaderConfig(**MIX, mix_policy="doremi", doremi_reference_losses=[1, 2]).mix
    with pytest.raises(ConfigError, match="doremi_reference_losses has 2 entries"):
        make_policy(mix, ["a", "b", "c"], [1, 1, 1])
