"""checks.errors.check_finite: its one-pass sum test never lets a NaN or Inf through and never
refuses finite values whose sum overflows; the error names the first bad batch index."""

import math

import pytest
import torch

from checks.errors import NonFiniteError, check_finite


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_finite_values_pass_even_when_their_sum_overflows(dtype):
    big = torch.finfo(dtype).max
    check_finite(torch.randn(3, 4, 5, dtype=dtype), "x")
    check_finite(torch.full((2, 3, 3), big, dtype=dtype), "x")  # the sum is +Inf, the values are not
    check_finite(torch.empty(0, 3, 3, dtype=dtype), "x")
    check_finite(torch.arange(6).reshape(1, 2, 3), "x")  # integers are finite


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_every_non_finite_value_is_found_and_located(bad):
    for where in [(0, 0, 0, 0), (2, 1, 3, 4), (1, 0, 2, 1)]:
        x = torch.randn(3, 2, 4, 5, dtype=torch.float64)
        x[where] = bad
        with pytest.raises(NonFiniteError) as info:
            check_finite(x, "x")
        assert info.value.index == where[:2]
    x = torch.randn(2, 3, 3, dtype=torch.float64)
    x[1, 0, 0], x[1, 2, 2] = math.inf, -math.inf  # opposite infinities: the sum is NaN
    with pytest.raises(NonFiniteError) as info:
        check_finite(x, "x", batch_dims=1)
    assert info.value.index == (1,)
