"""grammarspec/bench: the benchmarks' inputs, arms, scoring and reports."""
