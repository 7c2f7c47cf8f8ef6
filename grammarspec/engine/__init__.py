"""The decoding loop: rows, one step, the commit path, rejection sampling, masks, stops, processing."""
