"""The formats models come in and go out as, above the models they build:

- :mod:`~attnlab.formats.hf`: Hugging Face folders (``config.json`` and safetensors), read
  (:func:`from_hf`, each family's table, every config key accounted for) and written;
- :mod:`~attnlab.formats.gguf`: llama.cpp's GGUF files, read (header, metadata, tensors,
  tokenizer) and written;
- :mod:`~attnlab.formats.packaged`: pretrained models installed from the package registry;
- :mod:`~attnlab.formats.sentence`: sentence-transformers folders.

:func:`from_hf` reads a folder, a GGUF file or a packaged model's name.
"""

from .hf.load import from_hf

__all__ = ["from_hf"]
