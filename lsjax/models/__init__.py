"""Models: the target decoder (`target`) and the LongSpec draft (`draft`)."""
