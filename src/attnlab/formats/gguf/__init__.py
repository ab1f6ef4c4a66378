"""GGUF files: :mod:`.reader` parses the header and reads the tensors, every size checked
against the file; :mod:`.metadata` types each metadata key; :mod:`.tables` turns a file into a
Hugging Face config and weights; :mod:`.tokenizer` builds its tokenizer; :mod:`.writer`
writes a model as a GGUF file."""
