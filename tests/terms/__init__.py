"""The collector-side terms: the samplers, the normalisers, the curricula."""
