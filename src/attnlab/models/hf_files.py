"""Reading a Hugging Face checkpoint folder: its weight files, their headers (shapes and
dtypes, without reading a weight) and their tensors (pickles with ``weights_only=True``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ..errors import InputError
from ..io import read_state_dict, torch_load_safely

__all__ = ["weight_files", "is_hf_folder", "read_headers", "read_weights"]


def weight_files(folder: str | Path) -> list[Path]:
    """The weight files of a Hugging Face folder: ``model*.safetensors``, else
    ``pytorch_model*.bin`` (older folders)."""
    folder = Path(folder).expanduser()
    files = sorted(folder.glob("model*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise InputError(f"{folder} must hold model.safetensors or pytorch_model.bin (the weights in Hugging Face's "
                         f"layout); found neither")
    return files


# safetensors' names of dtypes -> torch's (the meta tensors of a header)
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                       "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32",
                       "U64": "uint64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def read_headers(folder: Path) -> dict[str, Tensor]:
    """The tensors of :func:`weight_files` as meta tensors of their stored shapes and dtypes,
    from the files' headers alone (safetensors' JSON header, whose offsets the library checks
    against the file's size; a pickle's records, loaded onto the meta device): no weight is
    read, whatever sizes the files claim."""
    from safetensors import safe_open

    headers: dict[str, Tensor] = {}
    for path in weight_files(folder):
        if path.suffix == ".safetensors":
            try:
                with safe_open(str(path), framework="pt") as f:
                    for key in f.keys():
                        part = f.get_slice(key)
                        dtype = getattr(torch, _SAFETENSORS_DTYPES.get(part.get_dtype(), ""), None)
                        if not isinstance(dtype, torch.dtype):
                            raise InputError(f"{path}: {key} has dtype {part.get_dtype()}, which attnlab does not read")
                        headers[key] = torch.empty(part.get_shape(), dtype=dtype, device="meta")
            except InputError:
                raise
            except Exception as exc:  # SafetensorError: a header that is not JSON, or offsets past the file's end
                raise InputError(f"could not read {path} as safetensors: {exc}") from None
            continue
        state = torch_load_safely(path, "meta")
        for key in ("state_dict", "model"):  # the wrappers read_state_dict takes off
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise InputError(f"{path} does not hold a state dict (a mapping of names to tensors)")
        headers.update(state)
    return headers


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The tensors of :func:`weight_files`, read with ``weights_only=True``: a pickle that
    names anything but tensors and plain values is refused, since unpickling it could run
    code."""
    weights: dict[str, Tensor] = {}
    for path in weight_files(folder):
        weights.update(read_state_dict(path))
    return weights


def is_hf_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder in Hugging Face's layout (it holds ``config.json``)."""
    path = Path(path).expanduser()
    return path.is_dir() and (path / "config.json").is_file()
