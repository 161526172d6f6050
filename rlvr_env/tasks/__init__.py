"""Built-in tasks, one per file."""
