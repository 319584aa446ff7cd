"""Whether EAGLE-3's start costs more than a plain prefill when the prefill hands the draft its streams."""
