from edgekv.cli.main import run

run()
