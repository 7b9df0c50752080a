"""The collector runtime: the Syncer, the sidecar, shared state, and the two workers' parity."""
