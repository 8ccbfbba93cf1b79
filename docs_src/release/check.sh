bash scripts/check-dist
