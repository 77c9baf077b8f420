"""The `lakesink` command."""
