"""proposers/: the draft sources, composition, cost and acceptance tracking, trees, the suffix index."""
