"""One module per ``edgekv`` command, each registered on :data:`edgekv.cli.main.app` by name.

A command module parses and checks its flags, calls one function of the layers below and renders what it returns.
It imports its command's implementation (edgekv.prediction, edgekv.sweep, edgekv.output, ...) inside the command function, so
that ``edgekv --help`` and every other command load none of it (tests/checks/test_layers.py, tests/checks/test_startup.py).
"""
