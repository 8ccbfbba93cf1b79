"""The command line (graceful/_cli): the hook's fast path, click's commands, exit codes."""
