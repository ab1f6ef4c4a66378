"""Data sets tokenized once and padded per batch: :mod:`.texts` (labelled sentences), :mod:`.lm`
(documents packed into windows), :mod:`.translation` (sentence pairs)."""
