"""The ``fedgrove`` command line (typer + rich); one module per command."""
