"""The batch KV cache: slots, Hugging Face cache helpers, packed and grouped attention, host values."""
