"""The typer application. Only this package imports typer and rich and prints."""
