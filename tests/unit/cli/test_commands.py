"""edgekv's command table (edgekv.cli.main.COMMANDS): `edgekv --help` lists each command from it without importing
the command's module, so the summaries it holds must be the commands' own."""

from __future__ import annotations

import typer

from edgekv.cli.main import COMMANDS, app, command, main


def test_each_summary_is_the_first_paragraph_of_its_commands_help():
    for name, (_, _, summary) in COMMANDS.items():
        cmd = command(name)
        assert cmd.name == name
        assert (cmd.help or "").split("\n\n")[0] == summary, (
            f"edgekv {name}: edgekv.cli.main.COMMANDS's summary differs from the first paragraph of the command's "
            f"help; copy it: {(cmd.help or '').split(chr(10) * 2)[0]!r}")


def test_help_lists_what_the_loaded_commands_would(capsys, monkeypatch):
    """The help printed from the summaries is the help typer prints from the commands themselves."""
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    loaded = typer.Typer(add_completion=False, help=app.info.help, context_settings=app.info.context_settings)
    loaded.callback(invoke_without_command=True)(app.registered_callback.callback)
    group = typer.main.get_command(loaded)
    for name in COMMANDS:
        group.add_command(command(name), name)
    group.main(["--help"], prog_name="edgekv", standalone_mode=False)
    assert listed == capsys.readouterr().out


def test_an_unknown_command_is_one_line(capsys):
    assert main(["predcit"]) == 2
    assert capsys.readouterr().err == "edgekv: error: No such command 'predcit'. (see 'edgekv --help')\n"
