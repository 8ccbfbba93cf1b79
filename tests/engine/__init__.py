"""Engine mode (graceful/_engine): presets, the page parser, the wait."""
