"""Files only, below everything that saves: crash-safe writes and versioned directories
(`atomic`), manifests (`manifest`), advisory locks (`lock`), the cache directory (`cache`).
Imports nothing of the package."""
