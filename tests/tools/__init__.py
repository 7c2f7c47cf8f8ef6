"""tools/: the developer scripts BENCHMARKS.md quotes (engine loop, replay, width cost, GPU check)."""
