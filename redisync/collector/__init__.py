"""The collector runtime: the seam terms implement, the Syncer and its two workers (a thread, or a
sidecar process reached through seqlocked shared memory), and the terms' shared buffers."""
