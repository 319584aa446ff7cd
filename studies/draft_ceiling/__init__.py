"""What holds the LongSpec draft at its acceptance (issue 92): the overfit check and what the draft reads."""
