"""LongSpec's training ablations (Table 2 / Figure 4): what anchor-offset indices and flash noisy training buy."""
