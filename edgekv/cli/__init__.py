"""CLI: thin typer adapters that parse llama.cpp-style flags, call one function, render."""

from edgekv.cli.main import app, run  # noqa: F401  (the `edgekv` console script)
