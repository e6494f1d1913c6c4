"""The package's version, on the ground floor: read by `__init__`, the exports, the server and
setup.py (which reads this file without importing the package)."""

__version__ = "0.4.0"
