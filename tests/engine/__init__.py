"""grammarspec/engine: the decoding loop, step, commit, rejection, sampling, masking, trees; exactness and parity."""
