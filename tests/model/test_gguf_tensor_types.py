"""Every tensor type gguf-py can decode loads; any other is a clear error naming the supported."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from cadence.model.errors import ModelLoadError
from cadence.model.gguf_fields import GGUFTensor
from cadence.model.gguf_loader import DEQUANTIZABLE_TYPES, _float_array
from cadence.model.loader import load_model

from .gguf_helpers import write_tiny_gguf

_Q = gguf.GGMLQuantizationType
ROWS, COLS = 4, 512  # 512 columns: whole blocks of every type (32 or 256 values)


def _tensor(qtype: gguf.GGMLQuantizationType, rng: np.random.Generator) -> tuple[GGUFTensor, np.ndarray]:
    """A tensor of `qtype` as GGUFFile hands it out, and its float32 values per gguf-py."""
    values = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    if qtype in (_Q.F32, _Q.F16, _Q.F64):
        data = values.astype({_Q.F32: np.float32, _Q.F16: np.float16, _Q.F64: np.float64}[qtype])
        return GGUFTensor("t", qtype, np.array([COLS, ROWS]), data), data.astype(np.float32)
    try:
        data = gguf.quants.quantize(values, qtype)
    except NotImplementedError:
        # No Python quantizer: random blocks whose 16-bit scales are small finite halves.
        data = rng.integers(0, 256, gguf.quant_shape_to_byte_shape((ROWS, COLS), qtype), dtype=np.uint8)
        block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
        blocks = data.reshape(-1, block_bytes)
        blocks[:, -2:] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        blocks[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return GGUFTensor("t", qtype, np.array([COLS, ROWS]), data), gguf.quants.dequantize(data, qtype)


@pytest.mark.parametrize("qtype", DEQUANTIZABLE_TYPES, ids=lambda t: t.name)
def test_every_decodable_type_gives_float32_rows(qtype):
    tensor, expected = _tensor(qtype, np.random.default_rng(qtype.value))
    got = _float_array(tensor, "test")
    assert got.shape == (ROWS, COLS) and got.dtype == np.float32 and got.flags.writeable
    np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.float32).reshape(ROWS, COLS))


def test_types_without_a_decoder_are_a_clear_error():
    undecodable = [t for t in _Q if t not in DEQUANTIZABLE_TYPES]
    assert _Q.Q8_1 in undecodable and _Q.Q4_K in DEQUANTIZABLE_TYPES and _Q.IQ4_XS in DEQUANTIZABLE_TYPES
    data = np.zeros(gguf.quant_shape_to_byte_shape((ROWS, COLS), _Q.Q8_1), dtype=np.uint8)
    tensor = GGUFTensor("blk.0.ffn_up.weight", _Q.Q8_1, np.array([COLS, ROWS]), data)
    with pytest.raises(ModelLoadError, match=r"'blk.0.ffn_up.weight' is stored as Q8_1.*supported: F32, F16, Q4_0"):
        _float_array(tensor, "m.gguf")


def test_a_file_with_an_undecodable_tensor_names_it(tiny_llama_dir, tmp_path):
    bad = np.zeros(gguf.quant_shape_to_byte_shape((128, 64), _Q.Q8_1), dtype=np.uint8)
    path = write_tiny_gguf(tiny_llama_dir, str(tmp_path / "q81.gguf"))
    # Rewrite one layer weight as Q8_1 bytes of the right size.
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        writer.add_key_value(field.name, field.contents(), field.types[0],
                             field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        if t.name == "blk.0.ffn_up.weight":
            writer.add_tensor(t.name, bad, raw_dtype=_Q.Q8_1)
        else:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="stored as Q8_1, which cannot be decoded"):
        load_model(str(tmp_path / "bad.gguf"), dtype="float32", device="cpu")
