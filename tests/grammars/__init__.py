"""grammars/: backends' contract, specs, validation, compile deadlines and caches, the schema corpus."""
