"""checks/_validation.py: the shared argument checks and the messages their callers keep."""

from __future__ import annotations

import pytest
import torch

from checks._validation import check_int, check_ndim, check_same_batch
from checks.gamma import gamma_spread_batched
from checks.projection import head_output
from checks.spectrum import eigenvalue_statistics
from fixtures.inputs import default_texts, image_tensor


@pytest.mark.parametrize("value, kwargs, message", [
    (True, dict(min_val=1), "n must be a positive int, got True"),
    (0, dict(min_val=1), "n must be a positive int, got 0"),
    (2.0, dict(), "n must be an int, got 2.0"),
    (1, dict(min_val=2), "n must be an int ≥ 2, got 1"),
    (9, dict(min_val=1, max_val=8), "n must be a positive int ≤ 8, got 9"),
    ("3", dict(min_val=1, allow_none=True), "n must be a positive int or None, got '3'"),
    (0, dict(min_val=1, expected="a count"), "n must be a count, got 0"),
])
def test_check_int_names_the_argument_what_it_must_be_and_the_value(value, kwargs, message):
    with pytest.raises(ValueError) as info:
        check_int(value, "n", **kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("value, kwargs", [(1, dict(min_val=1)), (-5, dict()), (None, dict(allow_none=True)),
                                           (8, dict(min_val=1, max_val=8))])
def test_check_int_accepts_what_it_should(value, kwargs):
    assert check_int(value, "n", **kwargs) is None


def test_check_ndim_and_check_same_batch():
    check_ndim(torch.zeros(2, 3), "keys")
    with pytest.raises(ValueError, match=r"^gamma must have shape \[\.\.\., N, m\], got \(3,\)$"):
        check_ndim(torch.zeros(3), "gamma", shape="[..., N, m]")
    # keys and values: everything but the last axis; queries and keys: everything but the tokens
    check_same_batch(torch.zeros(2, 5, 3), torch.zeros(2, 5, 7), ("k", "v"))
    check_same_batch(torch.zeros(2, 5, 3), torch.zeros(2, 9, 3), ("q", "k"), may_differ=-2)
    with pytest.raises(ValueError, match=r"^k and v must share leading dims and N; got \(2, 5, 3\) and \(5, 3\)$"):
        check_same_batch(torch.zeros(2, 5, 3), torch.zeros(5, 3), ("k", "v"))
    with pytest.raises(ValueError, match=r"^q \(2, 5, 3\) vs k \(2, 5, 4\)$"):
        check_same_batch(torch.zeros(2, 5, 3), torch.zeros(2, 5, 4), ("q", "k"), may_differ=-2,
                         message="q {x} vs k {y}")
    with pytest.raises(ValueError, match="must share"):
        check_same_batch(torch.zeros(3), torch.zeros(3), ("a", "b"))  # fewer than min_ndim dims


def test_callers_keep_their_own_messages():
    """The messages the checks' callers gave before the shared module, word for word."""
    with pytest.raises(ValueError, match=r"^queries \(2, 4, 3\) and keys \(2, 4, 5\) must share "
                                         r"leading dimensions and the head dimension d$"):
        head_output(torch.zeros(2, 4, 3), torch.zeros(2, 4, 5), torch.zeros(2, 4, 5))
    with pytest.raises(ValueError, match=r"^values \(2, 3, 5\) must have the keys' leading "
                                         r"dimensions and token count; keys are \(2, 4, 3\)$"):
        head_output(torch.zeros(2, 4, 3), torch.zeros(2, 4, 3), torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match=r"^k \[\.\.\., N, d\] and v \[\.\.\., N, d_v\] must share "
                                         r"leading dims and N; got \(4, 3\) and \(5, 3\)$"):
        gamma_spread_batched(torch.zeros(4, 3), torch.zeros(5, 3))
    with pytest.raises(ValueError, match=r"^d must be an integer in 1\.\.N=3, got 4$"):
        eigenvalue_statistics(torch.ones(2, 3), 4)
    with pytest.raises(ValueError, match=r"^n must be a positive int or None \(all\), got 0$"):
        default_texts(n=0)
    with pytest.raises(ValueError, match=r"^seed must be an int, got 1\.5$"):
        default_texts(n=2, seed=1.5)
    with pytest.raises(ValueError, match=r"^size must be a positive int, got 0$"):
        image_tensor([object()], size=0)
