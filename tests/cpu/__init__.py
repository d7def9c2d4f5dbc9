"""The CPU suite: runs everywhere, CI included (docs/testing.md)."""
