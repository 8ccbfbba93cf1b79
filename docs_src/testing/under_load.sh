bash scripts/test-under-load 3    # RUNS, then pytest's arguments
