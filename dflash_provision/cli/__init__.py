"""Click command-line layer: parse, call the core, render, map errors to exit codes."""
