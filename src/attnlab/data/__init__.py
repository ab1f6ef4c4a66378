"""Data for attnlab's tasks, in rooms:

* :mod:`.source`: the registry of data sources (``data.name``): :func:`register_source`,
  :func:`get_source`, :func:`list_sources`.
* :mod:`.kinds`: each kind of data with the keys its sources share and its built-in sources
  (:mod:`.kinds.labelled_images`: digits, cifar10; :mod:`.kinds.labelled_texts`: mr;
  :mod:`.kinds.sentence_pairs`: multi30k; :mod:`.kinds.text_corpus`: tinyshakespeare;
  :mod:`.kinds.reversal`: the reversal demo).
* :mod:`.sources`: the sources of one's own files (``folder``, ``file``, ``files``, ``text``).
* :mod:`.readers`: reading files safely: images (decoding, folder scans, CIFAR-10's batches with
  a restricted unpickler), tables, parallel files, strict text lines, MR, Multi30k, VADER.
* :mod:`.tokenizers`: :class:`TextTokenizer` (WordPiece or byte-level BPE) for text tasks, the
  language models' tokenizers (:class:`CharTokenizer`, :class:`ByteTokenizer`,
  :class:`BPETokenizer`), chat templates.
* :mod:`.transforms`: image transforms and presets, mixup and cutmix.
* :mod:`.batches`: data sets tokenized once and padded per batch (:class:`SentimentDataset`,
  :class:`LMDataset`, translation pairs).
* :mod:`.splits` (stratified and random hold-outs), :mod:`.paths` (where data lives:
  ``--data-dir``, ``$ATTNLAB_DATA_DIR``, ``~/.cache/attnlab``), :mod:`.download`.

Modules moved into these rooms keep their former paths until attnlab 0.4.0
(:mod:`attnlab.moved`).
"""

from .readers.cifar import CIFAR10, CIFAR10_CLASSES, load_cifar_batch
from .readers.image_sets import ImageFolder, ImageTensorDataset, load_digits_dataset
from .readers.image_decode import decode_images
from .readers.image_extensions import IMG_EXTENSIONS
from .batches.lm import LMDataset
from .tokenizers.lm import BPETokenizer, ByteTokenizer, CharTokenizer, LMTokenizer, load_tokenizer, train_tokenizer
from .transforms.mix import Mixup, cutmix_box, one_hot
from .readers.mr import load_mr, mr_folds, mr_split
from .readers.multi30k import load_multi30k
from .paths import data_dir, require
from .source import Source, SourceConfig, Splits, get_source, list_sources, register_source, source_of
from .readers.text import read_lines
from .batches.texts import SentimentDataset
from .tokenizers.text import SPECIAL_TOKENS, TextTokenizer, key_padding_mask
# the built-in sources register
from .kinds import labelled_images, labelled_texts, reversal, sentence_pairs, text_corpus  # noqa: F401
from .sources import image_folder, parallel_files, text_documents, text_files  # noqa: F401
from .readers import vader  # noqa: F401  # its sets, after every kind's own
from .kinds.text_corpus import CorpusSource, CorpusSourceConfig, read_text
from .transforms.images import (
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
