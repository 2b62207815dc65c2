"""Zero-copy NumPy (ml_dtypes) <-> torch exchange for BF16 and FP8 E4M3FN (and plain dtypes)."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from tilesim.shared.interop import is_torch_tensor, to_numpy, to_torch

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

CASES = [
    (BF16, "bfloat16", np.uint16),
    (FP8, "float8_e4m3fn", np.uint8),
]


def _patterns(np_dtype, ubits) -> np.ndarray:
    n = 1 << (8 * np.dtype(ubits).itemsize)
    return np.arange(n, dtype=np.uint64).astype(ubits).view(np_dtype).reshape(-1, 256)


@pytest.mark.parametrize(("np_dtype", "torch_name", "ubits"), CASES)
def test_numpy_to_torch_is_zero_copy_and_bit_exact(np_dtype, torch_name, ubits):
    a = _patterns(np_dtype, ubits)  # every bit pattern of the type, NaNs included
    keep = a.view(ubits).copy()
    t = to_torch(a)
    assert t.dtype == getattr(torch, torch_name) and tuple(t.shape) == a.shape
    assert t.data_ptr() == a.__array_interface__["data"][0]
    # same memory: the torch view reads the same bits, and a write through torch is visible
    tbits = t.view(torch.int16 if ubits is np.uint16 else torch.uint8).numpy().view(ubits)
    assert np.array_equal(tbits, keep)
    t.view(torch.uint8 if ubits is np.uint8 else torch.int16)[0, 0] = 1
    assert a.view(ubits)[0, 0] == 1


@pytest.mark.parametrize(("np_dtype", "torch_name", "ubits"), CASES)
def test_torch_to_numpy_is_zero_copy_and_bit_exact(np_dtype, torch_name, ubits):
    bits = _patterns(np_dtype, ubits).view(ubits)
    raw = torch.from_numpy(bits.view(np.int16) if ubits is np.uint16 else bits.copy())
    t = raw.view(getattr(torch, torch_name))
    a = to_numpy(t)
    assert a.dtype == np_dtype and a.shape == tuple(t.shape)
    assert a.__array_interface__["data"][0] == t.data_ptr()
    assert np.array_equal(a.view(ubits), bits)
    # values agree with torch's own widening (non-NaN) and the memory is shared
    finite = ~np.isnan(a.astype(np.float32))
    assert np.array_equal(a.astype(np.float32)[finite], t.float().numpy()[finite])
    a.view(ubits)[0, 2] = 0
    assert t.view(raw.dtype)[0, 2].item() == 0


def test_round_trips_return_the_same_memory():
    a = np.linspace(-1, 1, 96, dtype=np.float32).astype(BF16).reshape(8, 12)
    back = to_numpy(to_torch(a))
    assert np.shares_memory(back, a) and back.dtype == BF16
    t = torch.randn(5, 7).to(torch.float8_e4m3fn)
    assert to_torch(to_numpy(t)).data_ptr() == t.data_ptr()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.int32, np.float64])
def test_plain_dtypes_are_zero_copy_too(dtype):
    a = np.arange(12, dtype=dtype).reshape(3, 4)
    t = to_torch(a)
    assert t.data_ptr() == a.__array_interface__["data"][0]
    b = to_numpy(t)
    assert np.shares_memory(a, b) and b.dtype == a.dtype


def test_non_contiguous_input_is_copied_but_correct():
    a = np.arange(64, dtype=np.float32).astype(BF16).reshape(8, 8)[:, ::2]
    t = to_torch(a)
    assert t.is_contiguous()
    assert np.array_equal(t.view(torch.int16).numpy().view(np.uint16), a.view(np.uint16))
    tt = torch.arange(16.0).reshape(4, 4).to(torch.bfloat16).t()
    assert np.array_equal(to_numpy(tt).astype(np.float32), tt.float().numpy())


def test_to_numpy_accepts_grad_tensors_and_non_tensors():
    t = torch.ones(3, requires_grad=True)
    assert np.array_equal(to_numpy(t), np.ones(3, np.float32))
    assert to_numpy([1.0, 2.0]).tolist() == [1.0, 2.0]
    assert is_torch_tensor(t) and not is_torch_tensor(np.ones(2))


def test_to_numpy_rejects_non_cpu_tensors_with_a_named_error():
    t = torch.ones(2, device="meta")
    with pytest.raises(ValueError, match="to_numpy: expected a CPU tensor, got device meta"):
        to_numpy(t)


def test_is_torch_tensor_does_not_import_torch():
    code = (
        "import sys, numpy as np; from tilesim.shared.interop import is_torch_tensor; "
        "assert not is_torch_tensor(np.ones(2)); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def test_inputs_not_modified():
    a = np.linspace(-3, 3, 40, dtype=np.float32).astype(FP8)
    keep = a.view(np.uint8).copy()
    to_torch(a)
    to_numpy(to_torch(a))
    assert np.array_equal(a.view(np.uint8), keep)
    t = torch.linspace(-3, 3, 40).to(torch.bfloat16)
    tk = t.clone()
    to_numpy(t)
    assert torch.equal(t.view(torch.int16), tk.view(torch.int16))
