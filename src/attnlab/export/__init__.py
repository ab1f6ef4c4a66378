"""A trained run out of attnlab: a classifier as one ONNX or TorchScript file
(:mod:`.classifier`), a language model as a Hugging Face folder or a GGUF file
(:mod:`.language_model`)."""
