bash scripts/publish
