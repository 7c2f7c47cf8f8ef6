"""Developer tooling (fuzz, replay, memory check): run from the repository root, not installed."""
