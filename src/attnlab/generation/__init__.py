"""Generation: the searches over a model's session, below the models (it knows none of them).

- :mod:`~attnlab.generation.sessions`: the model's side of a generation (:class:`DecoderSession`,
  :class:`Seq2SeqSession`, the :class:`Step` an observer sees);
- :mod:`~attnlab.generation.search`: greedy search, sampling and streaming (:func:`generate`,
  :func:`stream`, :func:`translate`);
- :mod:`~attnlab.generation.beam`: beam search;
- :mod:`~attnlab.generation.processors` and :mod:`~attnlab.generation.sampling`: the logits
  processors (temperature, top-k, top-p, min-p, repetition penalty, stop strings) and the checks of
  a generation's options.

A model takes part by giving a session (``new_cache`` and ``decode_step``, or a decoder's step);
:meth:`attnlab.models.GPT.generate` is :func:`generate` on itself.
"""

from .search import beam_search, generate, greedy_search, stream, translate
from .sessions import DecoderSession, Observer, Seq2SeqSession, Step

__all__ = ["generate", "stream", "translate", "greedy_search", "beam_search", "DecoderSession", "Seq2SeqSession",
           "Step", "Observer"]
