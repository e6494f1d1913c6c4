"""Files only, below everything that saves: crash-safe writes and versioned directories
(`atomic`), manifests (`manifest`), advisory locks (`lock`). Imports nothing of the package."""
