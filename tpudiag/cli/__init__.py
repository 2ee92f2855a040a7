"""Thin typer commands: parse arguments, call the library, render."""
