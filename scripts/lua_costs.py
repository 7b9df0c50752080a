"""What small things cost inside a Redis script, in instructions (callgrind; see redisync/bench/instructions.py).

Each line is a throw-away script run by EVALSHA with the arguments of a 64-value fold (6 KEYS, 8 ARGV),
less the same EVALSHA of ``return 1``; loops of 100 are divided by 100. These are the prices the
fold's fixed cost is made of. Prints a table; ``--json`` prints the figures.
"""

from __future__ import annotations

import json
import struct
import sys

import numpy as np

from redisync.bench.instructions import CountingServer
from redisync.store.client import connect

PER_100 = {  # name: the body of a loop run 100 times
    "a C function call (tonumber of a decimal string)": "a = tonumber('12345')",
    "a checked decimal made a number by coercion": "a = '12345' + 0",
    "string.sub of a short string": "a = string.sub('counts:x', 1, 7)",
    "a number made part of a string": "a = 'slot:' .. i",
    "a string made of two strings": "a = 'slot:' .. 'x'",
    "an empty table": "a = {}",
    "an ipairs loop over one value": "for _, v in ipairs(one) do end",
    "a float added (one VM instruction)": "a = a + 1.5",
}
ONCE = {  # name: a script body run once
    "redis.call('INFO', 'server')": "redis.pcall('INFO', 'server')",
    "redis.call('TIME')": "redis.call('TIME')",
    "HMGET of 1 field": "redis.call('HMGET', 'h', 'f1')",
    "HMGET of 9 fields": "redis.call('HMGET', 'h', 'f1', 'f2', 'f3', 'f4', 'f5', 'f6', 'f7', 'f8', 'f9')",
    "HSET of 1 pair": "redis.call('HSET', 'h2', 'a', '1')",
    "HSET of 5 pairs": "redis.call('HSET', 'h2', 'a', '1', 'b', '2', 'c', '3', 'd', '4', 'e', '5')",
    # (the format a constant, as in the fold)
    "struct.pack of 32 float64": "struct.pack('<" + "d" * 32 + "', " + ", ".join(f"{k}.5" for k in range(32)) + ")",
    "struct.unpack of 32 float64": "struct.unpack('<" + "d" * 32 + "', ARGV[8], 1)",
    # the other decoder in this Lua: 32 msgpack float64s (a constant, made when the script is loaded)
    "cmsgpack.unpack_limit of 32 float64": "cmsgpack.unpack_limit('"
    + "".join(f"\\{b}" for b in b"".join(b"\xcb" + struct.pack(">d", 0.5 + k) for k in range(32)))
    + "', 32, 0)",
}


def main() -> None:
    server = CountingServer()
    try:
        r = connect(server.url, run="lua-costs", socket_timeout=600).redis
        r.hset("h", mapping={f"f{i}": "x" * 10 for i in range(20)})
        keys = [f"k{i}" for i in range(6)]
        argv = ["d" * 16, "0", "1", "5", "0", "0", "bench/stats", np.zeros(64).tobytes()]

        def cost(body: str) -> float:
            sha = r.script_load(body)
            return server.count(lambda: r.evalsha(sha, len(keys), *keys, *argv), 200)

        base = cost("return 1")
        loop = cost("local a, one = 0.0, {1} for i = 1, 100 do end return 1")
        out = {"the envelope: EVALSHA of 'return 1' with a fold's arguments": base}
        for name, body in PER_100.items():
            out[name] = (cost(f"local a, one = 0.0, {{1}} for i = 1, 100 do {body} end return 1") - loop) / 100
        for name, body in ONCE.items():
            out[name] = cost(f"{body} return 1") - base
    finally:
        server.close()
    if "--json" in sys.argv:
        print(json.dumps(out, indent=2))
    else:
        for name, v in out.items():
            print(f"{v:>12,.0f}  {name}")


if __name__ == "__main__":
    main()
