"""Modules that moved, still importable by their former paths until attnlab
:data:`~attnlab.suggest.FORMER_NAMES_GO_IN`, each import of a former path with a
``FutureWarning`` that names the new one.

A former path is the very module object of its new one (not a copy), so that what a program
patches or reads through either name is the same. Two tables say it all: :data:`MOVED` (modules)
and :data:`MOVED_NAMES` (names that left a module that stays, served by :func:`former_names`); a
test fails once the version that removes them is reached.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any, Callable

from .suggest import FORMER_NAMES_GO_IN

__all__ = ["MOVED", "MOVED_NAMES", "install", "former_names"]

# former module path -> new module path (a module split in several: their paths, whose public names it gives)
MOVED: dict[str, str | tuple[str, ...]] = {
    "attnlab.attention.grouped": "attnlab.attention.exact",
    "attnlab.attention.delta": "attnlab.attention.gated_delta",
    "attnlab.tasks.base": ("attnlab.run.recipe", "attnlab.run.task", "attnlab.run.trained"),  # split in three
    "attnlab.tasks.runs": "attnlab.run.skeleton",
    "attnlab.tasks.claim": "attnlab.run.claim",
    "attnlab.tasks.run_files": "attnlab.run.files",
    "attnlab.tasks.weights": "attnlab.run.weights",
    "attnlab.tasks.views": "attnlab.run.views",
    "attnlab.tasks.export": "attnlab.export.classifier",
    "attnlab.tasks.export_model": "attnlab.export.language_model",
    "attnlab.models.sessions": "attnlab.generation.sessions",
    "attnlab.models.generation": "attnlab.generation.search",
    "attnlab.models.beam": "attnlab.generation.beam",
    "attnlab.models.processors": "attnlab.generation.processors",
    "attnlab.models.sampling": "attnlab.generation.sampling",
    "attnlab.models.hf": "attnlab.formats.hf.load",
    "attnlab.models.hf_export": "attnlab.formats.hf.export",
    "attnlab.models.hf_files": "attnlab.formats.hf.files",
    "attnlab.models.hf_keys": "attnlab.formats.hf.keys",
    "attnlab.models.hf_tables": "attnlab.formats.hf.tables",
    "attnlab.models.gguf_reader": "attnlab.formats.gguf.reader",
    "attnlab.models.gguf_tables": "attnlab.formats.gguf.tables",
    "attnlab.models.gguf_metadata": "attnlab.formats.gguf.metadata",
    "attnlab.models.gguf_tokenizer": "attnlab.formats.gguf.tokenizer",
    "attnlab.models.gguf_writer": "attnlab.formats.gguf.writer",
    "attnlab.models.packaged": "attnlab.formats.packaged",
    "attnlab.models.sentence": "attnlab.formats.sentence",
    "attnlab.data.labelled_images": "attnlab.data.kinds.labelled_images",
    "attnlab.data.labelled_texts": "attnlab.data.kinds.labelled_texts",
    "attnlab.data.sentence_pairs": "attnlab.data.kinds.sentence_pairs",
    "attnlab.data.text_corpus": "attnlab.data.kinds.text_corpus",
    "attnlab.data.reversal": "attnlab.data.kinds.reversal",
    "attnlab.data.image_folder": "attnlab.data.sources.image_folder",
    "attnlab.data.text_files": "attnlab.data.sources.text_files",
    "attnlab.data.parallel_files": "attnlab.data.sources.parallel_files",
    "attnlab.data.text_documents": "attnlab.data.sources.text_documents",
    "attnlab.data.cifar": "attnlab.data.readers.cifar",
    "attnlab.data.mr": "attnlab.data.readers.mr",
    "attnlab.data.multi30k": "attnlab.data.readers.multi30k",
    "attnlab.data.vader": "attnlab.data.readers.vader",
    "attnlab.data.image_decode": "attnlab.data.readers.image_decode",
    "attnlab.data.image_scan": "attnlab.data.readers.image_scan",
    "attnlab.data.image_extensions": "attnlab.data.readers.image_extensions",
    "attnlab.data.images": "attnlab.data.readers.images",
    "attnlab.data.tables": "attnlab.data.readers.tables",
    "attnlab.data.parallel": "attnlab.data.readers.parallel",
    "attnlab.data.text": "attnlab.data.readers.text",
    "attnlab.data.image_datasets": "attnlab.data.readers.image_sets",
    "attnlab.data.tokenize": "attnlab.data.tokenizers.text",
    "attnlab.data.lm_tokenize": "attnlab.data.tokenizers.lm",
    "attnlab.data.chat": "attnlab.data.tokenizers.chat",
    "attnlab.data.mix": "attnlab.data.transforms.mix",
    "attnlab.data.lm_dataset": "attnlab.data.batches.lm",
    "attnlab.data.translation": "attnlab.data.batches.translation",
}


# a name that left a module that stays: "former module.name" -> the module that holds it now (with ":NewName"
# when it is called otherwise there)
MOVED_NAMES = {
    "attnlab.layers.DecoderCache": "attnlab.attention.cache:ModelCache",
    "attnlab.layers.transformer_layers.DecoderCache": "attnlab.attention.cache:ModelCache",
    "attnlab.models.gpt.LayerCaches": "attnlab.attention.cache:ModelCache",
    "attnlab.models.from_hf": "attnlab.formats",
    "attnlab.attention.latent.IndexedSparseAttention": "attnlab.attention.dsa",
    "attnlab.attention.latent.top_keys": "attnlab.attention.dsa",
    "attnlab.attention.differential.SinkAttention": "attnlab.attention.sinks",
    "attnlab.data.readers.text.SentimentDataset": "attnlab.data.batches.texts",
    "attnlab.tasks.language_modeling.load_folder": "attnlab.tasks.lm_folders",
    "attnlab.tasks.language_modeling.folder_sampling": "attnlab.tasks.lm_folders",
}


def former_names(module: str) -> Callable[[str], Any]:
    """A module's ``__getattr__`` that serves the names :data:`MOVED_NAMES` says left it, each with
    a notice: ``__getattr__ = former_names(__name__)``."""

    def __getattr__(name: str) -> Any:
        new = MOVED_NAMES.get(f"{module}.{name}")
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, _, called = new.partition(":")
        notice(f"{module}.{name}", f"{home}.{called or name}")
        return getattr(importlib.import_module(home), called or name)

    return __getattr__


def notice(former: str, new: str) -> None:
    warnings.warn(f"{former} is now {new}; the old path works until attnlab {FORMER_NAMES_GO_IN}", FutureWarning,
                  stacklevel=3)


class _Former(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a former path and loads it as the new module itself."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        if isinstance(new, str):
            notice(spec.name, new)
            return importlib.import_module(new)  # its own name and spec stay: it is the new module
        notice(spec.name, " and ".join(new))
        joined = ModuleType(spec.name, f"Former path of {', '.join(new)}, until attnlab {FORMER_NAMES_GO_IN}.")
        for path in new:
            part = importlib.import_module(path)
            for name in part.__all__:
                setattr(joined, name, getattr(part, name))
        return joined

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module ran when it was imported."""


def install() -> None:
    """Put the finder of former paths on ``sys.meta_path`` (once; ``import attnlab`` does it)."""
    if not any(isinstance(f, _Former) for f in sys.meta_path):
        sys.meta_path.append(_Former())
