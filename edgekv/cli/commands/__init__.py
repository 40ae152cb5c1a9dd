"""One module per ``edgekv`` command, each listed by name in :data:`edgekv.cli.main.COMMANDS`.

A command module parses and checks its flags, calls one function of the layers below and renders what it returns.
It imports its implementation (edgekv.prediction, edgekv.sweep, edgekv.output, ...) at its top; edgekv.cli.main
imports the module only when its command is dispatched, so that ``edgekv --help`` and every other command load none
of it (tests/checks/test_startup.py).
"""
