"""The sparkfleet command line (typer); each command group lives in its own module."""
