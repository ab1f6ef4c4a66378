"""Sizes attnlab refuses beyond, said once, in a module that imports nothing: the command
line reads them to build its options before it imports torch."""

from __future__ import annotations

__all__ = ["MAX_LINE_CHARS", "JSON_MAX_BYTES", "JSON_MAX_DEPTH", "CHAT_MAX_CHARS", "CHAT_MAX_SECONDS",
           "CHAT_MAX_BYTES", "CHAT_TEMPLATE_MAX_BYTES"]

# A line longer than this is refused before it is decoded (data.max_line_chars in a recipe,
# --max-line-chars on the command line): a hostile file of one 200 MB line would otherwise be
# read whole, decoded and split.
MAX_LINE_CHARS = 1_000_000

# JSON (attnlab.jsonfile): a file larger than this is refused before it is read; the largest
# these folders hold is a tokenizer.json of 33 MB (Gemma 3's 262,144 tokens).
JSON_MAX_BYTES = 128 * 2**20
# Deeper nesting is refused before it is parsed (Python's parser fails near 1,000 levels with
# a RecursionError); tokenizer.json and config.json nest 6 levels at most.
JSON_MAX_DEPTH = 64

# A chat template (attnlab.data.tokenizers.chat) renders at most this many characters (a prompt of
# 1,000,000 characters is about 250,000 tokens, past every context these models take) and
# runs at most this many seconds (real templates render in under 10 ms).
CHAT_MAX_CHARS = 1_000_000
CHAT_MAX_SECONDS = 5.0
# ... and grows the process's memory by at most about this much while it renders (values it
# makes in between, which a doubling loop can grow past any output limit before printing them).
CHAT_MAX_BYTES = 128 * 2**20
# A chat_template.jinja larger than this is refused before it is read (the largest of the
# families attnlab loads is under 20 KB).
CHAT_TEMPLATE_MAX_BYTES = 2**20
