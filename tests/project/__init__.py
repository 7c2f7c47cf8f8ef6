"""Repository-wide checks: the import graph, the data sample, the examples, the test statistics helper."""
