"""Reading a Hugging Face checkpoint folder: its weight files, their headers (shapes and
dtypes, without reading a weight) and their tensors (pickles with ``weights_only=True``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ...errors import InputError
from ...io import read_state_dict, torch_load_safely

__all__ = ["weight_files", "is_hf_folder", "is_pretrained", "open_checkpoint", "FolderCheckpoint", "read_headers",
           "read_weights"]


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


class FolderCheckpoint:
    """A Hugging Face folder as a checkpoint: :meth:`config` (its ``config.json``),
    :meth:`headers` (meta tensors), :meth:`weights` and :meth:`tokenizer`;
    :class:`~attnlab.formats.gguf.tables.GGUFCheckpoint` is the same for a GGUF file."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder).expanduser()
        self.config_file = self.path / "config.json"
        if not self.config_file.is_file():
            raise InputError(f"folder must be a Hugging Face checkpoint folder with config.json, or a GGUF file; "
                             f"{self.path} {'has no config.json' if self.path.is_dir() else 'is neither'}")

    def config(self) -> dict:
        from ...io import read_json_mapping

        return read_json_mapping(self.config_file)

    def headers(self) -> dict[str, Tensor]:
        return read_headers(self.path)

    def weights(self) -> dict[str, Tensor]:
        return read_weights(self.path)

    def tokenizer(self):  # type: ignore[no-untyped-def]  # an HFTokenizer (data imports models: imported late)
        from ...data.tokenizers.lm import HFTokenizer

        return HFTokenizer.load(self.path)


def _gguf_file(path: str | Path) -> bool:
    """A GGUF file, or a file named ``.gguf`` (which the GGUF reader then names as not one)."""
    from ..gguf.reader import is_gguf

    path = Path(path).expanduser()
    return is_gguf(path) or (path.suffix.lower() == ".gguf" and path.is_file())


def is_pretrained(path: str | Path) -> bool:
    """Whether ``path`` is a pretrained model attnlab reads: a Hugging Face folder or a GGUF file."""
    return is_hf_folder(path) or _gguf_file(path)


def open_checkpoint(path: str | Path):  # type: ignore[no-untyped-def]
    """The checkpoint at ``path``: a :class:`FolderCheckpoint` or, for a GGUF file, a
    :class:`~attnlab.formats.gguf.tables.GGUFCheckpoint`."""
    if _gguf_file(path):
        from ..gguf.tables import GGUFCheckpoint

        return GGUFCheckpoint(path)
    return FolderCheckpoint(path)
