"""grammarspec/serve: the OpenAI-compatible server, in-process, as a real process and through real clients."""
