"""Pure drafting policy: how many tokens to draft per row from measured costs and acceptance."""
