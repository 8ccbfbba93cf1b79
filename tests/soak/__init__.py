"""The load generator (graceful/_soak): end reasons and reports."""
