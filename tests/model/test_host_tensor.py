from __future__ import annotations

import pytest
import torch

from cadence.model.host_tensor import host_matrix, host_tensor


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_host_tensor_equals_torch_tensor(dtype):
    values = [0, 7, -3, 2**31 - 1]
    t = host_tensor(values, dtype)
    assert t.dtype == dtype and t.tolist() == values
    assert torch.equal(t, torch.tensor(values, dtype=dtype))


def test_host_tensor_outlives_its_buffer_and_takes_generators():
    t = host_tensor(i * i for i in range(5))
    del_me = [host_tensor(range(1000)) for _ in range(10)]  # churn the allocator
    del del_me
    assert t.tolist() == [0, 1, 4, 9, 16]


def test_host_tensor_empty_and_overflow():
    assert host_tensor([]).shape == (0,)
    with pytest.raises(OverflowError):
        host_tensor([2**31], torch.int32)


def test_host_matrix_shape_and_ragged_rows():
    m = host_matrix([(1, 2, 3), (4, 5, 6)], 3)
    assert m.dtype == torch.int32 and m.tolist() == [[1, 2, 3], [4, 5, 6]]
    with pytest.raises(ValueError, match="rows of 3"):
        host_matrix([(1, 2, 3), (4, 5)], 3)
