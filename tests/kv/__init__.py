"""grammarspec/kv: the batch KV cache, packed and grouped attention, prompt caches, sliding windows."""
