#!/usr/bin/env python3
"""Writes the small seed corpus of each fuzz target into fuzz/seeds/<target>/ (docs/fuzzing.md).

Protobuf is encoded by hand here so the seeds need nothing but Python."""
import hmac, hashlib, os, struct

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)

def vf(field, n):  # varint field
    return varint(field << 3) + varint(n)

def lf(field, data):  # length-delimited field
    if isinstance(data, str):
        data = data.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data

def entry(k, v):
    return lf(1, k) + lf(2, v)

def rls(domain, descriptors, hits=0):
    return lf(1, domain) + b"".join(lf(2, d) for d in descriptors) + (vf(3, hits) if hits else b"")

def desc(entries, limit=None, hits=None, negative=False):
    out = b"".join(lf(1, entry(k, v)) for k, v in entries)
    if limit:
        out += lf(2, vf(1, limit[0]) + vf(2, limit[1]))
    if hits is not None:
        out += lf(3, vf(1, hits) if hits else b"")
    if negative:
        out += vf(4, 1)
    return out

def check(domain, descs, cost=None):
    out = lf(1, domain) + b"".join(lf(2, lf(1, k) + lf(2, v)) for k, v in descs)
    if cost is not None:
        out += vf(3, cost)
    return out

def release(domain, descs, rid):
    return lf(1, domain) + b"".join(lf(2, lf(1, k) + lf(2, v)) for k, v in descs) + lf(3, rid)

def counts(region, sender, seq, sent_ms, groups):
    out = vf(1, 1) + lf(2, region) + lf(3, sender) + vf(4, seq) + vf(5, sent_ms)
    for rule, start, kind, figs in groups:
        g = lf(1, rule) + (vf(2, start) if start else b"")
        for suffix, count, shared in figs:
            g += lf(3, lf(1, suffix) + vf(2, count) + (vf(3, shared) if shared else b""))
        g += lf(4, kind) if kind else b""
        out += lf(6, g)
    return out

def frame(kind, payload, key=None, cluster=b"fuzz"):
    f = b"SLG" + kind + bytes([1 if key else 0, len(cluster)]) + cluster + payload
    if key:
        f += hmac.new(key, f, hashlib.sha256).digest()
    return f

seeds = {
    "envoy_rls": {
        "user": rls("edge", [desc([("user", "alice")])]),
        "two-descriptors": rls("edge", [desc([("remote_address", "10.0.0.1")]), desc([("user", "bob"), ("user", "x")])], hits=2),
        "override": rls("edge", [desc([("tenant", "t1")], limit=(5, 2))]),
        "peek-and-refund": rls("edge", [desc([("api_key", "k")], hits=0), desc([("api_key", "k")], negative=True)]),
        "unknown-domain": rls("nowhere", [desc([("k", "v")])]),
        "empty-entries": rls("edge", [b""]),
    },
    "sluice_v1": {
        "check": b"\x00" + check("edge", [("user", "alice")]),
        "check-cost": b"\x00" + check("api", [("k", "v")], cost=3),
        "check-concurrency": b"\x00" + check("edge", [("job", "j1")]),
        "release": b"\x01" + release("edge", [("job", "j1")], "fuzz-1"),
        "check-no-domain": b"\x00" + check("", [("k", "v")]),
    },
    "http_body": {
        "check": b'\x00{"domain":"edge","descriptors":{"user":"alice"}}',
        "check-cost": b'\x00{"domain":"api","descriptors":{"k":"v"},"cost":2}',
        "release": b'\x01{"domain":"edge","descriptors":{"job":"j1"},"request_id":"fuzz-1"}',
        "unknown-field": b'\x00{"domain":"edge","x":1}',
        "not-json": b"\x00{\"domain\":",
    },
    "gossip_datagram": {},
    "rules_file": {
        "basic.yaml": b"domain: d\nrules:\n  - { id: a, key: [k], algorithm: token_bucket, rate_per_s: 5, burst: 5 }\n",
        "two-docs.yaml": b"domain: a\nrules:\n  - { id: x, key: [k], algorithm: fixed_window, limit: 3, window: 1m, mode: shadow }\n---\ndomain: b\nrules:\n  - { id: y, key: [k, r], algorithm: sliding_log, limit: 3, window: 1s, headers: retry_only }\n",
        "override.yaml": b"domain: d\nrules:\n  - { id: a, match: { tier: free }, key: [api_key], algorithm: gcra, rate_per_s: 2, burst: 2, scope: global }\noverrides:\n  - { rule: a, identity: { api_key: vip }, rate_per_s: 50, burst: 50 }\n",
        "calendar.yaml": b"domain: d\nrules:\n  - { id: m, key: [k], algorithm: fixed_window, limit: 1000, window: 1mo, calendar_tz: Asia/Kolkata }\n  - { id: c, key: [job], algorithm: concurrency, limit: 2, timeout: 30s }\n",
    },
}

pkt = counts("eu-west", "eu-west-1", 7, 1_700_000_000_000, [
    ("per-ip", 1_700_000_000_000, "f", [("edge|remote_address=10.0.0.1", 5, 0), ("2", 3, 25)]),
    ("tb", 0, "t", [("api|k=v", 9, 0)]),
    ("old", 0, "", [("api|k=w", 1, 0)]),
])
seeds["gossip_datagram"] = {
    "payload": pkt,
    "plain-frame": frame(b"C", pkt),
    "keyed-frame": frame(b"C", pkt, key=bytes([7] * 32)),
    "membership-frame": frame(b"M", b"\x01\x02\x03"),
}

here = os.path.dirname(os.path.abspath(__file__))
for target, files in seeds.items():
    d = os.path.join(here, target)
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
