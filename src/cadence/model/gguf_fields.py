"""Reading a GGUF file's metadata and tensor table, fast.

`gguf.GGUFReader` builds a numpy view per field part, which for a 49152-token vocabulary and its
merges means hundreds of thousands of memmap slices (seconds per load). `GGUFFile` reads the same
header, key/value section and tensor table in one pass over an mmap with struct, decoding string
arrays straight to Python lists and numeric arrays through numpy, and exposes tensors the way
GGUFReader does (`name`, `tensor_type`, `shape` innermost first, `data` as a read-only array
over the mapped file), so `gguf.quants.dequantize` takes them as is.

`gguf_value` reads a key from either a GGUFFile or a gguf.GGUFReader.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

_MISSING = object()
_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

# GGUFValueType -> (struct format, numpy dtype) of the fixed-size scalar types.
_SCALARS: dict[int, tuple[str, str]] = {
    gguf.GGUFValueType.UINT8: ("<B", "<u1"), gguf.GGUFValueType.INT8: ("<b", "<i1"),
    gguf.GGUFValueType.UINT16: ("<H", "<u2"), gguf.GGUFValueType.INT16: ("<h", "<i2"),
    gguf.GGUFValueType.UINT32: ("<I", "<u4"), gguf.GGUFValueType.INT32: ("<i", "<i4"),
    gguf.GGUFValueType.FLOAT32: ("<f", "<f4"), gguf.GGUFValueType.BOOL: ("<?", "<?"),
    gguf.GGUFValueType.UINT64: ("<Q", "<u8"), gguf.GGUFValueType.INT64: ("<q", "<i8"),
    gguf.GGUFValueType.FLOAT64: ("<d", "<f8"),
}
# Tensor types GGUFReader hands out as typed arrays; every other (quantized) type is raw bytes.
_TYPED_TENSORS = {
    gguf.GGMLQuantizationType.F16: np.float16, gguf.GGMLQuantizationType.F32: np.float32,
    gguf.GGMLQuantizationType.F64: np.float64, gguf.GGMLQuantizationType.I8: np.int8,
    gguf.GGMLQuantizationType.I16: np.int16, gguf.GGMLQuantizationType.I32: np.int32,
    gguf.GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the file, as GGUFReader describes it."""

    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: np.ndarray  # dims, innermost first (GGUF order)
    data: np.ndarray  # read-only view of the mapped file (bytes for quantized types)


class GGUFFile:
    """Metadata (`fields`: key -> decoded value) and tensors of a little-endian GGUF v2/v3 file.

    Raises ValueError for anything that is not a well-formed GGUF file.
    """

    def __init__(self, path: str):
        with open(path, "rb") as f:
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as exc:  # empty file
                raise ValueError(f"cannot map file: {exc}") from exc
        self._pos = 0
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, KeyError, OverflowError) as exc:
            raise ValueError(f"malformed GGUF file: {exc}") from exc

    # -- primitive readers ------------------------------------------------------------------
    def _unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self._map, self._pos)[0]
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        length = self._unpack("<Q")
        end = self._pos + length
        if end > len(self._map):
            raise ValueError("string runs past the end of the file")
        text = self._map[self._pos:end].decode("utf-8")
        self._pos = end
        return text

    def _value(self, value_type: int) -> Any:
        if value_type == gguf.GGUFValueType.STRING:
            return self._string()
        if value_type == gguf.GGUFValueType.ARRAY:
            item_type = self._unpack("<I")
            count = self._unpack("<Q")
            if item_type in _SCALARS:
                dtype = np.dtype(_SCALARS[item_type][1])
                values = np.frombuffer(self._map, dtype=dtype, count=count, offset=self._pos)
                self._pos += count * dtype.itemsize
                return values.tolist()
            if item_type == gguf.GGUFValueType.STRING:
                return self._string_array(count)
            return [self._value(item_type) for _ in range(count)]
        if value_type in _SCALARS:
            return self._unpack(_SCALARS[value_type][0])
        raise ValueError(f"unknown GGUF value type {value_type}")

    def _string_array(self, count: int) -> list[str]:
        # The hot loop of a load (vocabulary and merges): locals and from_bytes, no struct calls.
        buf, pos, size = self._map, self._pos, len(self._map)
        from_bytes = int.from_bytes
        out = []
        append = out.append
        for _ in range(count):
            length = from_bytes(buf[pos:pos + 8], "little")
            pos += 8
            if pos + length > size:
                raise ValueError("string array runs past the end of the file")
            append(buf[pos:pos + length].decode("utf-8"))
            pos += length
        self._pos = pos
        return out

    # -- layout -----------------------------------------------------------------------------
    def _parse(self) -> None:
        if self._map[:4] != _MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        self._pos = 4
        version = self._unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version} (or a big-endian file)")
        num_tensors = self._unpack("<Q")
        num_fields = self._unpack("<Q")
        self.fields: dict[str, Any] = {}
        for _ in range(num_fields):
            key = self._string()
            self.fields[key] = self._value(self._unpack("<I"))
        infos = []
        for _ in range(num_tensors):
            name = self._string()
            n_dims = self._unpack("<I")
            dims = np.frombuffer(self._map, dtype="<u8", count=n_dims, offset=self._pos).copy()
            self._pos += 8 * n_dims
            infos.append((name, dims, gguf.GGMLQuantizationType(self._unpack("<I")),
                          self._unpack("<Q")))
        alignment = int(self.fields.get("general.alignment", _DEFAULT_ALIGNMENT))
        start = self._pos + (-self._pos) % alignment
        self.tensors = [self._tensor(start, *info) for info in infos]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise ValueError("duplicated tensor names")

    def _tensor(self, start: int, name: str, dims: np.ndarray,
                tensor_type: gguf.GGMLQuantizationType, offset: int) -> GGUFTensor:
        n_elements = int(np.prod(dims))
        block_size, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
        n_bytes = n_elements * type_size // block_size
        begin = start + offset
        if begin + n_bytes > len(self._map):
            raise ValueError(f"tensor {name!r} runs past the end of the file")
        np_dims = tuple(int(d) for d in reversed(dims.tolist()))
        if tensor_type in _TYPED_TENSORS:
            data = np.frombuffer(self._map, dtype=_TYPED_TENSORS[tensor_type], count=n_elements,
                                 offset=begin)
        else:
            data = np.frombuffer(self._map, dtype=np.uint8, count=n_bytes, offset=begin)
            np_dims = gguf.quant_shape_to_byte_shape(np_dims, tensor_type)
        return GGUFTensor(name, tensor_type, dims, data.reshape(np_dims))


def gguf_value(reader: GGUFFile | gguf.GGUFReader, key: str, default: Any = _MISSING) -> Any:
    """The decoded value of metadata `key` (str, number, bool or list); KeyError if absent."""
    if isinstance(reader, GGUFFile):
        if key in reader.fields:
            return reader.fields[key]
    else:
        field = reader.fields.get(key)
        if field is not None:
            return field.contents()
    if default is _MISSING:
        raise KeyError(f"GGUF metadata has no {key!r}")
    return default
