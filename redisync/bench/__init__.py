"""The benchmarks behind ``redisync bench``: the store's latencies and throughput (``core``), how its
cost grows with the fleet (``scale``), the collector beside torch.distributed's collectives
(``peers``), and the terms' cost on the collector (``terms``)."""
