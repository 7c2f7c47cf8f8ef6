"""The test suite, one folder per room of the code; shared helpers (toy tokenizers and models, fakes, the chi-square
harness, the server process) at this top level, imported as ``tests.<module>``."""
