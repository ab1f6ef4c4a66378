"""Hugging Face folders: :mod:`.files` reads a folder's (or a GGUF file's) config and tensors,
:mod:`.keys` accounts for every key of ``config.json``, :mod:`.tables` holds each family's
conversion, :mod:`.load` builds the model (:func:`~attnlab.formats.hf.load.from_hf`) and
:mod:`.export` writes one back."""
