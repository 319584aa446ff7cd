"""The CPU decode step against the time to read its weights and K/V, before and after the decode layout."""
