"""Data-parallel training across devices and processes (``dist_sync`` kvstores, local launches)."""
