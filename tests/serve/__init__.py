"""``graceful run`` (graceful/_serve) end to end: real processes, real signals."""
