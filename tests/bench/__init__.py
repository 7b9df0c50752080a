"""The benchmarks: figures that measure what they claim."""
