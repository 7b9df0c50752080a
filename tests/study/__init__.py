"""The study's pipeline, statistics and report."""
