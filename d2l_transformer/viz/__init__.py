"""Pictures: loss curves, the positional encoding, attention heatmaps (`png`)."""
