"""grammarspec/model: loading, the prepacked output head, the OpenMP pool."""
