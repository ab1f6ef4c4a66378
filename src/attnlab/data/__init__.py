"""Data sets, transforms and batch mixing for attnlab.

* :mod:`.source`: the registry of data sources (``data.name``): :func:`register_source`,
  :func:`get_source`; each kind of data has a module with its keys and built-in sources
  (:mod:`.labelled_images`: digits, cifar10; :mod:`.labelled_texts`: mr;
  :mod:`.sentence_pairs`: multi30k; :mod:`.text_corpus`: tinyshakespeare; :mod:`.reversal`),
  and each source of one's own data a module of its own (:mod:`.image_folder`,
  :mod:`.text_files`, :mod:`.parallel_files`, :mod:`.text_documents`).
* :mod:`.splits`: stratified and random hold-outs, per-class caps.
* :mod:`.paths`: where data lives (``--data-dir``, ``$ATTNLAB_DATA_DIR``, ``~/.cache/attnlab``).
* Image data sets: :mod:`.image_datasets` (images in memory, digits, any ``root/<class>/<file>``
  folder as :class:`ImageFolder`), :mod:`.cifar` (CIFAR-10: image folders or the original pickled
  batches, read with a restricted unpickler), :mod:`.image_decode` (safe decoding with Pillow,
  on threads), :mod:`.image_scan` (listing a folder of class folders), :mod:`.image_extensions`;
  :mod:`.images` re-exports them for older imports.
* :mod:`.transforms`: tensor transforms and the CIFAR-10 / digits presets.
* :mod:`.mix`: mixup and cutmix with soft targets.
* :mod:`.mr`, :mod:`.multi30k`: the MR sentence-polarity and Multi30k translation corpora.
* :mod:`.tokenize`: :class:`TextTokenizer` (WordPiece or byte-level BPE, Hugging Face ``tokenizers``).
* :mod:`.text`: strict reading of text files, :class:`SentimentDataset`.
* :mod:`.lm_tokenize`: tokenizers for language models (:class:`CharTokenizer`,
  :class:`ByteTokenizer`, :class:`BPETokenizer`, :func:`load_tokenizer`).
* :mod:`.lm_dataset`: :class:`LMDataset`, documents packed into windows for a language model.
"""

from .cifar import CIFAR10, CIFAR10_CLASSES, load_cifar_batch
from .image_datasets import ImageFolder, ImageTensorDataset, load_digits_dataset
from .image_decode import decode_images
from .image_extensions import IMG_EXTENSIONS
from .lm_dataset import LMDataset
from .lm_tokenize import BPETokenizer, ByteTokenizer, CharTokenizer, LMTokenizer, load_tokenizer, train_tokenizer
from .mix import Mixup, cutmix_box, one_hot
from .mr import load_mr, mr_folds, mr_split
from .multi30k import load_multi30k
from .paths import data_dir, require
from .source import Source, SourceConfig, Splits, get_source, list_sources, register_source, source_of
from .text import SentimentDataset, read_lines
from .tokenize import SPECIAL_TOKENS, TextTokenizer, key_padding_mask
from . import image_folder, labelled_images, labelled_texts, parallel_files, reversal, sentence_pairs, text_corpus, text_documents, text_files, vader  # noqa: E501,F401  # the built-in sources register
from .text_corpus import CorpusSource, CorpusSourceConfig, read_text
from .transforms import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    DIGITS_MEAN,
    DIGITS_STD,
    Compose,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    Resize,
    ToFloat,
    TrivialAugment,
    cifar_eval_transforms,
    cifar_train_transforms,
    digits_transforms,
)

__all__ = [
    "Source",
    "SourceConfig",
    "Splits",
    "register_source",
    "get_source",
    "source_of",
    "list_sources",
    "data_dir",
    "require",
    "IMG_EXTENSIONS",
    "CIFAR10_CLASSES",
    "ImageTensorDataset",
    "ImageFolder",
    "CIFAR10",
    "decode_images",
    "load_cifar_batch",
    "load_digits_dataset",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "DIGITS_MEAN",
    "DIGITS_STD",
    "Compose",
    "ToFloat",
    "Normalize",
    "RandomCrop",
    "RandomHorizontalFlip",
    "Resize",
    "TrivialAugment",
    "cifar_train_transforms",
    "cifar_eval_transforms",
    "digits_transforms",
    "Mixup",
    "one_hot",
    "cutmix_box",
    "load_mr",
    "mr_folds",
    "mr_split",
    "load_multi30k",
    "read_lines",
    "SentimentDataset",
    "SPECIAL_TOKENS",
    "TextTokenizer",
    "key_padding_mask",
    "CorpusSourceConfig",
    "CorpusSource",
    "read_text",
    "LMTokenizer",
    "CharTokenizer",
    "ByteTokenizer",
    "BPETokenizer",
    "load_tokenizer",
    "train_tokenizer",
    "LMDataset",
]
