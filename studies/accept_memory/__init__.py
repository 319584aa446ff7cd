"""Whether a fixed method's acceptance has a memory: the hit rate after a hit and after a miss."""
