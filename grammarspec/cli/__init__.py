"""The ``grammarspec`` command line."""
