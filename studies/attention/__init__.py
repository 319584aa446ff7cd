"""Hybrid tree attention (split prefix + tree, LSE merge) against naive masked attention."""
