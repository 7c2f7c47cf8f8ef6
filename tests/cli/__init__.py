"""grammarspec/cli: the command line."""
