"""DeLS-Spec's alpha-beta scan (the paper's Figure 2): tau over the fusion weights."""
