"""The language-modelling task's recipe: its ``text`` section (tokenization and context,
:class:`LMTextConfig`) and its ``generate`` section (the samples a run writes and the defaults of
``predict``, :class:`SampleConfig`), in :class:`LanguageModelingRecipe`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from ..data.kinds.text_corpus import CorpusSourceConfig
from ..data.tokenizers.text import MAX_VOCAB
from ..errors import InputError
from ..generation.sampling import GENERATION_OPTIONS, check_generation
from ..run.recipe import ModelConfig, Recipe

__all__ = ["LMTextConfig", "SampleConfig", "LanguageModelingRecipe", "DEFAULT_MAX_NEW_TOKENS"]


@dataclass
class LMTextConfig:
    """Tokenization and context of a language model."""

    tokenizer: Literal["char", "byte", "bpe"] = "char"
    vocab_size: int = field(default=8192, metadata={"min": 260, "max": MAX_VOCAB})  # bpe: the vocabulary to learn
    min_frequency: int = field(default=2, metadata={"min": 1})  # bpe: of a merge
    context: int = field(default=256, metadata={"min": 2})  # tokens a model reads at once
    tokenizer_file: Optional[str] = None  # a tokenizer.json to use instead of training one
    # tokenizer_file: the largest share of the training text's tokens it may map to its unknown token (a tokenizer
    # made for other text); a larger share is refused before training, one above the default is said in the log
    max_unknown: float = field(default=0.01, metadata={"min": 0.0, "max": 1.0})


@dataclass
class SampleConfig:
    """The samples a finished run writes (and the defaults of ``predict``)."""

    prompts: list = field(default_factory=lambda: ["\n"])
    max_new_tokens: int = field(default=200, metadata={"min": 0})
    temperature: float = field(default=0.8, metadata={"min": 0.0})  # 0: greedy
    top_k: Optional[int] = field(default=None, metadata={"min": 0})  # 0 or null: no limit
    top_p: Optional[float] = field(default=None, metadata={"gt": 0.0, "max": 1.0})
    min_p: Optional[float] = field(default=None, metadata={"min": 0.0, "max": 1.0})  # of the likeliest's probability
    repetition_penalty: float = field(default=1.0, metadata={"gt": 0.0})  # above 1: repeats less likely; 1: none
    seed: int = field(default=0, metadata={"min": 0, "max": 2**64 - 1})
    stop: list = field(default_factory=list)  # texts that end a continuation (left out of it)

    def __post_init__(self) -> None:
        if not isinstance(self.prompts, list) or not self.prompts or \
                not all(isinstance(p, str) and p for p in self.prompts):
            raise InputError(f"generate.prompts must be a list of non-empty texts; got {self.prompts!r}")
        check_generation(names=lambda key: f"generate.{key}", **self.options())

    def options(self) -> dict[str, Any]:
        """The sampling options, as :meth:`GPT.stream` takes them (and ``stop``)."""
        return {key: getattr(self, key) for key in GENERATION_OPTIONS}


@dataclass
class LanguageModelingRecipe(Recipe):
    task: str = "language_modeling"
    data: CorpusSourceConfig = field(default_factory=CorpusSourceConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig("gpt_tiny"))
    text: LMTextConfig = field(default_factory=LMTextConfig)
    generate: SampleConfig = field(default_factory=SampleConfig)



DEFAULT_MAX_NEW_TOKENS = SampleConfig.__dataclass_fields__["max_new_tokens"].default
