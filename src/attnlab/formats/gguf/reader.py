"""Reading a GGUF file (llama.cpp's format): its metadata, its tensors' table, and each
tensor dequantized to float32.

The header is parsed here rather than by ``gguf.GGUFReader`` so that every count, length,
shape and offset is checked against the file's size before anything it sizes is read or
allocated: a hostile file never makes attnlab allocate more than the file could hold, and a
file cut short is named as truncated. (``GGUFReader`` also walks each of a vocabulary's
strings as a numpy view, many times slower than reading them as bytes here.) The
block layouts and their dequantization are the ``gguf`` package's (the reader llama.cpp's
project publishes): ``gguf.quants.dequantize``, vectorised with numpy, applied to a few
rows at a time into the output tensor, so the peak memory is the dequantized model and one
chunk.

Layout (all little-endian): ``GGUF``, version (2 or 3), tensor count, metadata count; the
metadata as key, type, value; each tensor's name, dimensions (innermost first), type and
offset; padding to ``general.alignment`` (32); the tensors' data.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...errors import InputError

__all__ = ["GGUFFile", "GGUFTensor", "is_gguf", "require_gguf", "SUPPORTED_TYPES"]

MAGIC = b"GGUF"
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
# Strings longer than this are refused (the longest in real files is a chat template, ~10 KB).
MAX_STRING_BYTES = 16 * 2**20

# Metadata value types: id -> (name, struct format or None for string/array).
_SCALARS = {0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"), 4: ("uint32", "<I"),
            5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<?"), 10: ("uint64", "<Q"), 11: ("int64", "<q"),
            12: ("float64", "<d")}
_STRING, _ARRAY = 8, 9
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
          10: np.uint64, 11: np.int64, 12: np.float64}

# The tensor types attnlab dequantizes, as ggml numbers them: name, elements a block, bytes a block.
SUPPORTED_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
}
# Rows dequantized at a time: the chunk's temporaries (several float32 copies inside gguf's
# dequantization) stay near 4M elements, whatever the tensor's size.
_CHUNK_ELEMENTS = 1 << 22
_MAX_ELEMENTS = 2**63 - 1


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a file that starts as a GGUF file does."""
    path = Path(path).expanduser()
    if not path.is_file():
        return False
    try:
        with path.open("rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def require_gguf() -> Any:
    """The ``gguf`` package, or one line saying how to install it."""
    try:
        import gguf
        import gguf.quants  # noqa: F401
    except ImportError:
        raise InputError("reading a GGUF file needs the gguf package (llama.cpp's reader): "
                         "pip install 'attnlab[gguf]' or pip install gguf") from None
    return gguf


@dataclass(frozen=True)
class GGUFTensor:
    """One entry of the tensor table: its shape as torch orders it (outermost first), ggml
    type, and where its bytes lie in the file."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int  # from the file's start
    nbytes: int

    @property
    def type_name(self) -> str:
        return SUPPORTED_TYPES[self.type_id][0]


class _Cursor:
    """Reads the header, refusing any length that runs past the end of the file."""

    def __init__(self, path: Path, buf: Any, size: int) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise InputError(f"{self.path}: truncated: {what} needs {n:,} bytes at offset {self.pos:,} but the file "
                             f"ends at {self.size:,}")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        if n > MAX_STRING_BYTES:
            self.need(n, what)  # past the end: truncated; else merely too long
            raise InputError(f"{self.path}: {what} is a string of {n:,} bytes; at most {MAX_STRING_BYTES:,} are read")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")  # llama.cpp keeps such tokens; so do we, marked

    def value(self, type_id: int, what: str) -> Any:
        if type_id in _SCALARS:
            return self.unpack(_SCALARS[type_id][1], what)
        if type_id == _STRING:
            return self.string(what)
        if type_id == _ARRAY:
            item = self.unpack("<I", what)
            count = self.unpack("<Q", what)
            if item in _SCALARS:  # read in one piece, its size checked first
                width = struct.calcsize(_SCALARS[item][1])
                self.need(count * width, f"{what} ({count:,} values)")
                out = np.frombuffer(self.buf, dtype=np.dtype(_NUMPY[item]).newbyteorder("<"), count=count,
                                    offset=self.pos).copy()
                self.pos += count * width
                return out
            if item == _STRING:
                self.need(count * 8, f"{what} ({count:,} strings)")  # each at least its 8-byte length
                return [self.string(what) for _ in range(count)]
            raise InputError(f"{self.path}: {what} is an array of type {item}; GGUF's arrays hold numbers or strings")
        raise InputError(f"{self.path}: {what} has value type {type_id}, which GGUF does not define (0-12)")


class GGUFFile:
    """A GGUF file opened for reading: ``metadata`` (key -> value; arrays of numbers as
    numpy arrays), ``tensors`` (name -> :class:`GGUFTensor`), and :meth:`read` of one tensor
    as float32. Every size in the header is checked against the file before use."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        try:
            self._file = self.path.open("rb")
            size = self.path.stat().st_size
            self._buf = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except OSError as exc:
            raise InputError(f"could not read {self.path}: {exc.strerror or exc}") from None
        self.size = size
        cur = _Cursor(self.path, self._buf, size)
        cur.need(4, "the magic number")
        if bytes(self._buf[:4]) != MAGIC:
            raise InputError(f"{self.path} is not a GGUF file (it does not start with 'GGUF')")
        cur.pos = 4
        self.version = cur.unpack("<I", "the version")
        if self.version not in (2, 3):
            raise InputError(f"{self.path}: GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors = cur.unpack("<Q", "the tensor count")
        n_kv = cur.unpack("<Q", "the metadata count")
        cur.need(n_kv * 12, f"{n_kv:,} metadata entries")  # each: a key's length and a type at least
        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata entry {i}'s key")
            type_id = cur.unpack("<I", f"metadata {key}'s type")
            if key in self.metadata:
                raise InputError(f"{self.path}: metadata key {key!r} appears twice")
            self.metadata[key] = cur.value(type_id, f"metadata {key}")
        cur.need(n_tensors * 24, f"{n_tensors:,} tensor entries")  # name length, dims count, type, offset
        infos = []
        for i in range(n_tensors):
            name = cur.string(f"tensor entry {i}'s name")
            n_dims = cur.unpack("<I", f"tensor {name}'s dimension count")
            if not 1 <= n_dims <= MAX_DIMS:
                raise InputError(f"{self.path}: tensor {name} has {n_dims} dimensions; GGUF's have 1 to {MAX_DIMS}")
            dims = [cur.unpack("<Q", f"tensor {name}'s dimensions") for _ in range(n_dims)]
            type_id = cur.unpack("<I", f"tensor {name}'s type")
            offset = cur.unpack("<Q", f"tensor {name}'s offset")
            infos.append((name, dims, type_id, offset))
        alignment = self.metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise InputError(f"{self.path}: metadata general.alignment must be a power of two; got {alignment!r}")
        start = -(-cur.pos // alignment) * alignment
        self.tensors: dict[str, GGUFTensor] = {}
        for name, dims, type_id, offset in infos:
            if type_id not in SUPPORTED_TYPES:
                raise InputError(f"{self.path}: tensor {name} has type {_type_name(type_id)}, which attnlab does not "
                                 f"dequantize; it reads {', '.join(v[0] for v in SUPPORTED_TYPES.values())}")
            if name in self.tensors:
                raise InputError(f"{self.path}: tensor {name} appears twice")
            tname, block, block_bytes = SUPPORTED_TYPES[type_id]
            numel = 1
            for d in dims:
                numel *= d
            if max(dims) > _MAX_ELEMENTS or numel > _MAX_ELEMENTS:  # ggml's sizes are int64, as torch's
                raise InputError(f"{self.path}: tensor {name}'s dimensions {' x '.join(map(str, dims[::-1]))} are not "
                                 f"sizes of a tensor (each, and their product, at most 2^63 - 1)")
            if dims[0] % block:
                raise InputError(f"{self.path}: tensor {name}'s rows of {dims[0]} values are not whole blocks of "
                                 f"{block} ({tname})")
            nbytes = numel // block * block_bytes
            if offset % alignment:
                raise InputError(f"{self.path}: tensor {name}'s offset {offset:,} is not a multiple of the alignment "
                                 f"{alignment}")
            if start + offset + nbytes > size:
                raise InputError(f"{self.path}: truncated: tensor {name} ({tname}, {' x '.join(map(str, dims[::-1]))}) "
                                 f"needs bytes {start + offset:,} to {start + offset + nbytes:,} but the file ends "
                                 f"at {size:,}")
            self.tensors[name] = GGUFTensor(name, tuple(int(d) for d in reversed(dims)), type_id, start + offset, nbytes)

    def close(self) -> None:
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()
        self._file.close()

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes (a view of the mapped file), as rows of its innermost size."""
        t = self.tensors[name]
        _, block, block_bytes = SUPPORTED_TYPES[t.type_id]
        row_bytes = t.shape[-1] // block * block_bytes
        data = np.frombuffer(self._buf, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        return data.reshape(-1, row_bytes) if row_bytes else data.reshape(0, 0)

    def read(self, name: str, out: Tensor | None = None) -> Tensor:
        """Tensor ``name`` dequantized to float32 in its shape (into ``out`` when given), a
        chunk of rows at a time."""
        t = self.tensors[name]
        if out is None:
            out = torch.empty(t.shape, dtype=torch.float32)
        flat = out.view(-1, t.shape[-1]) if t.shape[-1] else out.view(0, 0)
        raw = self.raw(name)
        rows = max(1, _CHUNK_ELEMENTS // max(t.shape[-1], 1))
        if t.type_id == 0:  # F32: a copy
            flat.numpy()[:] = raw.view("<f4")
        elif t.type_id == 1:  # F16: numpy's conversion is exact
            for i in range(0, raw.shape[0], rows):
                flat.numpy()[i:i + rows] = raw[i:i + rows].view("<f2")
        elif t.type_id == 30:  # BF16: the high half of a float32
            for i in range(0, raw.shape[0], rows):
                flat.numpy()[i:i + rows].view(np.uint32)[:] = raw[i:i + rows].view("<u2").astype(np.uint32) << 16
        else:
            quants = require_gguf().quants
            kind = quants.GGMLQuantizationType(t.type_id)
            for i in range(0, raw.shape[0], rows):
                flat.numpy()[i:i + rows] = quants.dequantize(raw[i:i + rows], kind)
        return out


def _type_name(type_id: int) -> str:
    try:
        from gguf import GGMLQuantizationType

        return f"{GGMLQuantizationType(type_id).name} ({type_id})"
    except (ImportError, ValueError):
        return str(type_id)
