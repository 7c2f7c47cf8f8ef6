"""grammarspec/drafting: the pass cost profile and its check."""
