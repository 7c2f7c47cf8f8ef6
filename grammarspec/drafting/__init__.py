"""Draft sources that need the model: the draft model, assistant resolution, the pass-cost profile."""
