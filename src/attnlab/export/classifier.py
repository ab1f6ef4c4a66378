"""A trained classifier as one file that runs without attnlab: ONNX (onnxruntime, and any
ONNX runtime) or TorchScript (``torch.jit.load``), with a ``<stem>.preprocessing.json``
beside it that says how to feed it.

::

    run = load_run("runs/vit-digits")
    result = export_run(run, "export/digits.onnx")     # digits.onnx + digits.preprocessing.json
    verify_export(result, run)                          # max |logits difference| against PyTorch

What the file takes (``B`` and ``L`` are free: any batch size, any text length up to the
run's ``text.max_length``)::

    image classifier   image           uint8   (B, C, H, W)   read in run.image.mode, resized to
                                                              run.image.size; the run's transform
                                                              (to float, normalisation) is in the graph
    text classifier    input_ids       int64   (B, L)         the run's tokenizer, [CLS] ... [SEP],
                       attention_mask  int64   (B, L)         right-padded; 1 = token, 0 = padding
    both               logits          float32 (B, num_classes)

A run with LoRA adapters is exported with them merged into the weights (plain linear
layers; the outputs equal the adapted model's to float32 rounding).

A text classifier's tokenizer is saved beside the model as ``<stem>.tokenizer.json`` (the
``tokenizers`` library reads it). Runs that generate text (translation, the reversal
demo) are not exported: their decoding loop (beam search) is Python, not one graph.

ONNX export uses ``torch.onnx.export(..., dynamo=True)``: the exporter that captures the
model with ``torch.export``, torch's default since 2.9 and the one it maintains (the
TorchScript-based ``dynamo=False`` exporter is deprecated). Both exporters gave the same
parity on attnlab's ViT, attention CNN, BoTNet and sentiment classifier (torch 2.13, CPU);
the dynamo one was kept because it traces shapes symbolically: the batch and sequence
axes are free by construction, where the TorchScript tracer turns every Python check of a
shape into a constant of the one example it ran and warns about each (a dozen warnings
per model here). It needs ``onnxscript``: ``pip install 'attnlab[export]'``.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import InputError, shape_str
from ..io import WriteError, atomic_write
from ..layers.lora import lora_layers, merge_lora
from ..run.trained import TrainedRun

__all__ = ["FORMATS", "ExportResult", "ImageClassifierGraph", "TextClassifierGraph", "export_run", "model_file",
           "verify_export"]

# format -> the model file's extension
FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}
_INSTALL = "pip install 'attnlab[export]'"
# Example sizes the graph is captured with: 0 and 1 are avoided, torch.export specialises them.
_EXAMPLE_BATCH, _EXAMPLE_LENGTH = 2, 8
# TorchScript is deprecated in torch 2.13 (in favour of torch.export); its files still save and load.
_JIT_DEPRECATED = r".*torch\.jit\.(save|load).* is deprecated"


@dataclass
class ExportResult:
    """What :func:`export_run` wrote: the model file, its ``preprocessing.json`` and, for a
    text classifier, the tokenizer; the graph's input and output names, in call order."""

    path: Path
    preprocessing: Path
    format: str
    input_names: list[str]
    output_names: list[str]
    tokenizer: Path | None = None


# ----------------------------------------------------------------------------- the graphs


class ImageClassifierGraph(nn.Module):
    """``uint8`` images ``(B, C, H, W)`` -> ``transform`` -> ``model`` -> logits ``(B, num_classes)``:
    an image classifier with its preprocessing inside, so that the caller only decodes and resizes."""

    def __init__(self, model: nn.Module, transform: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        self.model, self.transform = model, transform

    def forward(self, image: Tensor) -> Tensor:
        return self.model(self.transform(image))


class TextClassifierGraph(nn.Module):
    """``input_ids`` and ``attention_mask`` ``(B, L)`` -> logits ``(B, num_classes)``: both inputs
    required and named, as the tokenizer's ``encode`` returns them."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.model(input_ids, attention_mask)


@dataclass
class _Plan:
    """What one run exports as: the graph, example inputs to capture it with, each input's
    axes (dimension -> symbolic name), and the entries of preprocessing.json."""

    graph: nn.Module
    examples: dict[str, Tensor]
    axes: dict[str, dict[int, str]]
    largest: dict[str, int]  # symbolic axis -> its largest value, where it has one
    info: dict[str, Any]


def _device(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def _plan(run: TrainedRun) -> _Plan:
    """The graph of ``run``'s classifier, or an :class:`InputError` for a run that is not one."""
    task = run.task.name
    if run.task.outputs != "labels":
        raise InputError(f"export covers classifiers (image and text); run {run.run_dir} is a {task} run, whose "
                         f"model generates text with a decoding loop that is not one graph")
    device = _device(run.model)
    # LoRA adapters merged into the weights (a copy: the run's model keeps them): the graph holds
    # plain linear layers, and verify_export compares it with the adapted model
    model = merge_lora(copy.deepcopy(run.model)) if lora_layers(run.model) else run.model
    if run.image is not None:
        mode, (h, w) = run.image.mode, tuple(run.image.size)
        channels = {"L": 1, "RGB": 3}.get(mode)
        if channels is None:
            raise InputError(f"run.image.mode must be 'L' or 'RGB' to export; got {mode!r}")
        image = torch.randint(0, 256, (_EXAMPLE_BATCH, channels, h, w), dtype=torch.uint8, device=device)
        info = {"image": {"mode": mode, "size": [h, w], "channels": channels,
                          "normalization": "inside the graph", "transform": repr(run.image.transform)}}
        return _Plan(ImageClassifierGraph(model, run.image.transform), {"image": image}, {"image": {0: "batch"}},
                     {}, info)
    if run.tokenizer is not None:
        # The longest text: the tokenizer truncates to text.max_length, the model's positions stop at max_len.
        bounds = [getattr(getattr(run.recipe, "text", None), "max_length", None),
                  getattr(getattr(run.model, "config", None), "max_len", None)]
        longest = min((b for b in bounds if isinstance(b, int)), default=None)
        max_length = bounds[0] if isinstance(bounds[0], int) else longest
        length = min(_EXAMPLE_LENGTH, longest or _EXAMPLE_LENGTH)
        batch = run.tokenizer.pad([[run.tokenizer.pad_id + 1] * length, [run.tokenizer.pad_id + 1] * (length - 1)])
        examples = {k: v.to(device) for k, v in batch.items()}  # one padded row: the mask's path is captured
        axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
        info = {"text": {"max_length": max_length, "padding": "right", "pad_id": run.tokenizer.pad_id,
                         "cls_id": run.tokenizer.cls_id, "sep_id": run.tokenizer.sep_id}}
        return _Plan(TextClassifierGraph(model), examples, axes, {} if longest is None else {"sequence": longest},
                     info)
    raise InputError(f"export covers classifiers (image and text); run {run.run_dir} ({task}) has neither an image "
                     f"preprocessing (run.image) nor a tokenizer (run.tokenizer)")


# ----------------------------------------------------------------------------- writing


def model_file(out: str | Path, format: str = "onnx", *, name: str = "out") -> Path:
    """The model file that an export to ``out`` writes: ``out`` itself when it ends in the
    format's extension, else ``out/model<ext>``. Checked before any work: an :class:`InputError`
    naming ``out`` as ``name`` (``--out`` on the command line) when it cannot be written there,
    because a folder on its path is a file, or it is a folder itself."""
    if format not in FORMATS:
        raise InputError(f"format must be one of {', '.join(map(repr, FORMATS))}; got {format!r}")
    ext = FORMATS[format]
    out = Path(out).expanduser()
    if out.suffix == ext:
        if out.is_dir():
            raise InputError(f"{name} {out} is a folder; give a {ext} file to write (or a folder without the {ext} "
                             f"ending, which receives model{ext})")
        path = out
    elif out.suffix and not out.is_dir():
        raise InputError(f"{name} must be a {ext} file or a folder for format={format!r}; got {str(out)!r}")
    else:
        path = out / f"model{ext}"
    folder = next((p for p in path.parents if p.exists() or p.is_symlink()), None)
    if folder is not None and not folder.is_dir():
        if folder == out:
            raise InputError(f"{name} must be a {ext} file or a folder for format={format!r}; {out} is a file "
                             f"without the {ext} ending")
        raise InputError(f"{name} {out}: {folder} is a file, not a folder, so nothing can be written below it; "
                         f"choose another {name}")
    return path


def _import_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401  # the dynamo exporter's op library
    except ImportError as exc:
        raise InputError(f"format 'onnx' needs the onnx packages ({exc.name} is not installed): {_INSTALL}") from None


@contextmanager
def _quiet() -> Iterator[None]:
    """The exporter's notes that concern nothing here (torchvision ops it skips, the names of
    axes shared by two inputs, deprecations inside torch) kept off the console."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*axis name.*will not be used", category=UserWarning)
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"(torch|copyreg|onnxscript)")
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"(torch|onnxscript)")
            yield
    finally:
        logger.setLevel(level)


def _onnx_bytes(plan: _Plan, opset: int | None) -> tuple[bytes, int]:
    """The ONNX model's bytes and its opset."""
    names = list(plan.examples)
    dims = {axis: torch.export.Dim(axis, min=1, **({"max": plan.largest[axis]} if axis in plan.largest else {}))
            for axes in plan.axes.values() for axis in axes.values()}
    shapes = tuple({d: dims[axis] for d, axis in plan.axes[name].items()} for name in names)
    with _quiet():
        program = torch.onnx.export(plan.graph, tuple(plan.examples.values()), None, input_names=names,
                                    output_names=["logits"], opset_version=opset, dynamic_shapes=shapes,
                                    dynamo=True, external_data=False, verbose=False)
    proto = program.model_proto
    version = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return proto.SerializeToString(), version


def _torchscript(plan: _Plan) -> torch.jit.ScriptModule:
    with _quiet(), warnings.catch_warnings():
        # The tracer warns at every Python check of a shape (the inputs' validation); the checks
        # pass for the example and the graph's arithmetic reads sizes from the tensors.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        return torch.jit.trace(plan.graph, tuple(plan.examples.values()), check_trace=False)


def _io_spec(plan: _Plan, num_classes: int) -> tuple[list[dict], list[dict]]:
    inputs = [{"name": name, "dtype": str(t.dtype).removeprefix("torch."),
               "shape": [plan.axes[name].get(d, s) for d, s in enumerate(t.shape)]}
              for name, t in plan.examples.items()]
    return inputs, [{"name": "logits", "dtype": "float32", "shape": ["batch", num_classes]}]


def _how_to_call(format: str, plan: _Plan, model_name: str, tokenizer_name: str | None) -> str:
    if format == "onnx":
        load = f"onnxruntime.InferenceSession('{model_name}')"
        call = "session.run(['logits'], {%s})[0]"
    else:
        load = f"torch.jit.load('{model_name}').eval()"
        call = "module(%s)"
    if "image" in plan.info:
        img = plan.info["image"]
        h, w = img["size"]
        feed = "'image': batch" if format == "onnx" else "torch.from_numpy(batch)"
        return (f"Load the model with {load}. Read each image in PIL mode {img['mode']!r} and resize it to "
                f"{w}x{h} (width x height; attnlab uses bilinear filtering), as a uint8 array (C, H, W) = "
                f"({img['channels']}, {h}, {w}) with values 0..255 (channels first: a PIL array (H, W, C) needs "
                f"transposing, a grey one a leading axis); stack the images into a batch (B, C, H, W) of any size B "
                f"and call {call % feed}. The conversion to float and the normalisation are inside the graph: pass "
                f"the raw pixels. The logits (B, num_classes) give the class of each image by argmax (probabilities "
                f"by softmax), in the order of 'classes'.")
    text = plan.info["text"]
    feed = ("'input_ids': ids, 'attention_mask': mask" if format == "onnx"
            else "torch.from_numpy(ids), torch.from_numpy(mask)")
    n = text["max_length"]
    keep = f"keep its first {n - 2} ids and " if n else ""
    most = f", so that no text exceeds max_length={n} tokens" if n else ""
    return (f"Load the model with {load} and the tokenizer with tokenizers.Tokenizer.from_file('{tokenizer_name}'). "
            f"Encode each text with add_special_tokens=False, {keep}wrap the ids as [CLS] ids [SEP] (ids "
            f"{text['cls_id']} and {text['sep_id']}){most}. Right-pad the batch to its longest text with the padding "
            f"id {text['pad_id']}: input_ids int64 (B, L), and attention_mask int64 (B, L), 1 at tokens and 0 at "
            f"padding. Call {call % feed}; the logits (B, num_classes) give the class of each text by argmax "
            f"(probabilities by softmax), in the order of 'classes'.")


def export_run(run: TrainedRun, out: str | Path, format: str = "onnx", *, opset: int | None = None,
               overwrite: bool = False) -> ExportResult:
    """Write ``run``'s classifier as one model file, with ``<stem>.preprocessing.json`` beside it.

    ``out``: the model file (``.onnx`` for ``format="onnx"``, ``.pt`` for ``"torchscript"``)
    or a folder, which receives ``model.onnx`` / ``model.pt``. ``opset``: the ONNX opset
    (default: the exporter's). An image classifier takes ``uint8`` images ``(B, C, H, W)``
    with the run's transform in the graph; a text classifier takes ``input_ids`` and
    ``attention_mask`` and gets its tokenizer saved as ``<stem>.tokenizer.json``. Every file
    is written atomically. Raises :class:`InputError` for a run that is not a classifier,
    an unknown format, or format ``"onnx"`` without the onnx packages, and, unless
    ``overwrite``, when a file it would write exists already.
    """
    if format not in FORMATS:
        raise InputError(f"format must be one of {', '.join(map(repr, FORMATS))}; got {format!r}")
    if opset is not None and (format != "onnx" or not isinstance(opset, int) or isinstance(opset, bool) or opset < 1):
        raise InputError(f"opset must be a positive int, for format 'onnx' only; got {opset!r} with format {format!r}")
    path = model_file(out, format)
    stem = path.name.removesuffix(FORMATS[format])
    if not overwrite:
        there = [p for p in (path, path.with_name(f"{stem}.preprocessing.json"), path.with_name(f"{stem}.tokenizer.json"))
                 if p.exists()]
        if there:
            raise InputError(f"out: {', '.join(map(str, there))} exist{'s' if len(there) == 1 else ''} already; pass "
                             f"--force (overwrite=True in Python) to replace {'it' if len(there) == 1 else 'them'}, "
                             f"or choose another --out")
    plan = _plan(run)
    if format == "onnx":
        _import_onnx()
    training = run.model.training
    plan.graph.eval()  # the wrapper and the run's model; the model's mode is restored below
    try:
        with torch.no_grad():
            num_classes = int(plan.graph(*plan.examples.values()).shape[-1])
            if format == "onnx":
                data, opset = _onnx_bytes(plan, opset)
            else:
                traced = _torchscript(plan)
    finally:
        run.model.train(training)
    tokenizer = path.with_name(f"{stem}.tokenizer.json") if run.tokenizer is not None and "text" in plan.info \
        else None
    inputs, outputs = _io_spec(plan, num_classes)
    spec = {"format": format, "model_file": path.name, "task": run.task.name, "model": run.recipe.model.name,
            "checkpoint": run.checkpoint.name, **({"opset": opset} if format == "onnx" else {}),
            "inputs": inputs, "outputs": outputs, "classes": run.classes, **plan.info}
    if tokenizer is not None:
        spec["text"] = {"tokenizer": tokenizer.name, **spec["text"]}
    spec["how_to_call"] = _how_to_call(format, plan, path.name, tokenizer.name if tokenizer else None)
    preprocessing = path.with_name(f"{stem}.preprocessing.json")
    files = {path: data if format == "onnx" else _torchscript_bytes(traced)}
    if tokenizer is not None:
        files[tokenizer] = _tokenizer_bytes(run.tokenizer)
    files[preprocessing] = (json.dumps(spec, indent=1) + "\n").encode()
    _write_together(files)
    return ExportResult(path, preprocessing, format, [i["name"] for i in inputs], [o["name"] for o in outputs],
                        tokenizer)


def _torchscript_bytes(traced: torch.jit.ScriptModule) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_JIT_DEPRECATED, category=DeprecationWarning)
        torch.jit.save(traced, buffer)
    return buffer.getvalue()


def _tokenizer_bytes(tokenizer: Any) -> bytes:
    """What ``tokenizer.save`` writes, as bytes: saved into a temporary folder and read back,
    so that its file is written with the others (:func:`_write_together`)."""
    with tempfile.TemporaryDirectory(prefix="attnlab-export-") as folder:
        return Path(tokenizer.save(Path(folder) / "tokenizer.json")).read_bytes()


def _write_together(files: dict[Path, bytes]) -> None:
    """Each file into a temporary file beside it (:func:`~attnlab.io.atomic_write`), flushed and
    synced, and only when all are whole are they renamed into place: a full disk leaves no
    file of the export, whole or half-written, and the files of an earlier export keep
    their content. A :class:`~attnlab.io.WriteError` names the file and its size."""
    try:
        with ExitStack() as stack:
            for path, data in files.items():
                f = stack.enter_context(atomic_write(path))
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
    except WriteError as exc:
        if exc.size is None and exc.filename is not None and Path(exc.filename) in files:
            exc.size = len(files[Path(exc.filename)])
        raise


# ----------------------------------------------------------------------------- parity


def _random_inputs(run: TrainedRun, plan: _Plan, seed: int = 0) -> dict[str, Tensor]:
    """Inputs of other sizes than the examples the graph was captured with: 3 images, or 3
    texts of lengths L, L-3 and 2 with L (up to 13) padded, so the free axes are exercised."""
    gen = torch.Generator().manual_seed(seed)
    if "image" in plan.examples:
        shape = (3, *plan.examples["image"].shape[1:])
        return {"image": torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)}
    longest = max(3, min(_EXAMPLE_LENGTH + 5, plan.largest.get("sequence", _EXAMPLE_LENGTH + 5)))
    vocab, pad = run.tokenizer.vocab_size, run.tokenizer.pad_id
    rows = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (longest, max(1, longest - 3), 2)]
    rows = [[t if t != pad else (pad + 1) % vocab for t in row] for row in rows]
    return run.tokenizer.pad(rows)


def _samples(run: TrainedRun, plan: _Plan, samples: Any) -> dict[str, Tensor]:
    if samples is None:
        return _random_inputs(run, plan)
    if "image" in plan.examples:
        if not (isinstance(samples, Tensor) and samples.dtype == torch.uint8 and samples.dim() == 4):
            got = f"{samples.dtype} {shape_str(samples)}" if isinstance(samples, Tensor) else type(samples).__name__
            raise InputError(f"samples must be a uint8 image batch (B, C, H, W) for an image classifier; got {got}")
        return {"image": samples}
    if isinstance(samples, dict):
        missing = [k for k in plan.examples if k not in samples]
        if missing:
            raise InputError(f"samples must have the keys {list(plan.examples)}; {missing} missing")
        return {k: samples[k] for k in plan.examples}
    if isinstance(samples, str) or not isinstance(samples, Sequence):
        raise InputError(f"samples must be a list of texts (or an encoded batch) for a text classifier; "
                         f"got {type(samples).__name__}")
    return run.tokenizer.encode(list(samples), max_length=plan.info["text"]["max_length"])


def verify_export(result: ExportResult, run: TrainedRun, samples: Any = None) -> float:
    """The largest absolute difference between the logits of the exported file (run by
    onnxruntime, or ``torch.jit.load``) and of ``run.model`` on the same ``samples``.

    ``samples``: a ``uint8`` batch ``(B, C, H, W)`` for an image classifier; a list of
    texts (encoded with the run's tokenizer) or ``{"input_ids", "attention_mask"}`` for a
    text classifier; ``None``: random inputs of another batch size (and text length) than
    the export was captured with."""
    plan = _plan(run)
    feed = {k: v.cpu() for k, v in _samples(run, plan, samples).items()}
    training = run.model.training
    plan.graph.eval()
    try:
        with torch.no_grad():
            device = _device(run.model)
            expected = plan.graph(*(v.to(device) for v in feed.values())).float().cpu().numpy()
    finally:
        run.model.train(training)
    if result.format == "onnx":
        try:
            import onnxruntime
        except ImportError:
            raise InputError(f"verifying an ONNX export needs onnxruntime: {_INSTALL}") from None
        session = onnxruntime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
        got = session.run(result.output_names, {k: v.numpy() for k, v in feed.items()})[0]
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_JIT_DEPRECATED, category=DeprecationWarning)
            module = torch.jit.load(str(result.path), map_location="cpu").eval()
        with torch.no_grad():
            got = module(*feed.values()).float().numpy()
    if got.shape != expected.shape:
        raise RuntimeError(f"the exported model gave logits of shape {got.shape}; PyTorch gave {expected.shape}")
    return float(np.abs(got.astype(np.float64) - expected.astype(np.float64)).max(initial=0.0))
