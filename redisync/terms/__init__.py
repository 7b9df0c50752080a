"""The collector-side terms that sync through the store: ``torch/`` (the sampler, the normaliser and
the curriculum terms on torch tensors) and ``numpy/`` (the sampler and the normaliser on numpy arrays
an environment owns), computing the same formulas (`.formulas`). Import the one you use."""
