"""What runs on a lent accelerator machine without a network: the device check's and the device job's plumbing."""
