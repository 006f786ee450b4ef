#!/usr/bin/env python3
"""kv_events_test.py - KV-cache events in vLLM's wire format (issue 17).

A subscriber written with Debian's python3-zmq and python3-msgpack follows
kvserve's events over ZMQ, rebuilds the set of cached blocks per medium,
and checks it against /metrics, against the prompts sent (block chains,
token ids, and the documented SHA-256 hash recomputed from them), through
eviction and demotion to the CPU tier, and a late joiner's replay.
Skips (77) without the Python modules or a kvserve built without libzmq.
"""
import hashlib
import struct
import sys
import time

import kvs

try:
    import msgpack
    import zmq
except ImportError as e:
    kvs.skip(f"python3-zmq / python3-msgpack missing ({e})")

BS = 16
TOPIC = b"kv-events"
ADMIN_KEY = "sk-kv-events-admin"


class Follower:
    """A subscriber that applies every batch to the set of (hash, medium)."""

    def __init__(self, ctx, endpoint):
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self.sub.connect(endpoint)
        self.blocks = {}  # (hash, medium) -> (parent, tokens)
        self.next_seq = None
        self.n_events = 0
        self.kinds = {}

    def apply(self, seq, payload):
        if self.next_seq is not None:
            assert seq == self.next_seq, f"sequence gap: {seq} after {self.next_seq - 1}"
        self.next_seq = seq + 1
        batch = msgpack.unpackb(payload, raw=False)
        assert isinstance(batch, list) and len(batch) == 3, batch
        ts, events, dp_rank = batch
        assert isinstance(ts, float) and abs(ts - time.time()) < 60, ts
        assert dp_rank == 0
        for ev in events:
            self.n_events += 1
            tag = ev[0]
            self.kinds[tag] = self.kinds.get(tag, 0) + 1
            if tag == "BlockStored":
                assert len(ev) == 7, ev
                _, hashes, parent, tokens, block_size, lora_id, medium = ev
                assert block_size == BS and lora_id is None and medium in ("GPU", "CPU")
                assert len(hashes) * BS == len(tokens)
                for i, h in enumerate(hashes):
                    assert isinstance(h, bytes) and len(h) == 32
                    key = (h, medium)
                    assert key not in self.blocks, "stored twice without a removal"
                    self.blocks[key] = (parent, tuple(tokens[i * BS:(i + 1) * BS]))
                    parent = h
            elif tag == "BlockRemoved":
                assert len(ev) == 3, ev
                _, hashes, medium = ev
                for h in hashes:
                    assert (h, medium) in self.blocks, "removed a block never stored"
                    del self.blocks[(h, medium)]
            elif tag == "AllBlocksCleared":
                self.blocks.clear()
            else:
                raise AssertionError(f"unknown event {ev!r}")

    def drain(self, quiet=0.4):
        """Applies messages until none came for `quiet` seconds."""
        while self.sub.poll(int(quiet * 1000)):
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == TOPIC
            assert len(seq) == 8
            self.apply(int.from_bytes(seq, "big"), payload)

    def medium(self, m):
        return {h: v for (h, med), v in self.blocks.items() if med == m}


def block_hash(parent, tokens, salt=b"default"):
    """README "Scaling out": kvserve's block hash, recomputed."""
    h = hashlib.sha256()
    if parent is None:
        h.update(b"kvs-bm1" + bytes([len(salt)]) + salt)
    else:
        h.update(parent)
    h.update(struct.pack(f"<{len(tokens)}i", *tokens))
    h.update(b"\x00")  # no extra key
    return h.digest()


def main():
    pub_port, replay_port = kvs.free_port(), kvs.free_port()
    cfg = ('{"enable_kv_cache_events": true, "publisher": "zmq", '
           f'"endpoint": "tcp://127.0.0.1:{pub_port}", '
           f'"replay_endpoint": "tcp://127.0.0.1:{replay_port}", "topic": "kv-events"}}')
    try:
        srv = kvs.Server(["--kv-events-config", cfg, "--block-size", str(BS),
                          "--admin-api-key", ADMIN_KEY,
                          "--num-kv-blocks", "40", "--swap-space", "0.0005",
                          "--enable-prefix-caching", "--max-num-seqs", "4"])
    except RuntimeError as e:
        if "without libzmq" in str(e):
            kvs.skip("kvserve built without libzmq/msgpack-c")
        raise
    ctx = zmq.Context()
    try:
        live = Follower(ctx, f"tcp://127.0.0.1:{pub_port}")
        time.sleep(0.5)  # ZMQ's slow joiner: let the subscription reach the publisher

        def prompt_ids(text):
            st, body = kvs.http("POST", srv.url + "/tokenize", {"prompt": text})
            assert st == 200, body
            return body["tokens"]

        def complete(text):
            st, body = kvs.http("POST", srv.url + "/v1/completions",
                                {"model": "austen-2.7m", "prompt": text, "max_tokens": 4,
                                 "temperature": 0})
            assert st == 200, body

        def check_against_metrics():
            live.drain()
            _, s = kvs.metrics(srv.url)
            dev = kvs.sample(s, "kvserve:kv_blocks", tier="device", state="cached")
            cpu = kvs.sample(s, "kvserve:kv_blocks", tier="cpu", state="cached")
            used = kvs.sample(s, "kvserve:kv_blocks", tier="device", state="used")
            assert used == 0, "requests still running"
            assert len(live.medium("GPU")) == dev, (len(live.medium("GPU")), dev)
            assert len(live.medium("CPU")) == cpu, (len(live.medium("CPU")), cpu)
            assert kvs.sample(s, "kvserve:kv_events_dropped_total") == 0
            assert kvs.sample(s, "kvserve:kv_events_published_total") == live.n_events
            return dev, cpu

        # 1. Three prompts: each prompt's full blocks are stored as a chain
        #    whose token ids are the prompt's and whose hashes recompute.
        texts = [f"Chapter {i}. " + "Anne Elliot walked along the Cobb at Lyme. " * 6
                 for i in range(3)]
        for t in texts:
            complete(t)
        check_against_metrics()
        gpu = live.medium("GPU")
        for t in texts:
            ids = prompt_ids(t)
            parent = None
            for b in range(len(ids) // BS):
                toks = tuple(ids[b * BS:(b + 1) * BS])
                h = block_hash(parent, toks)
                assert h in gpu, f"block {b} of a prompt was not reported stored"
                assert gpu[h] == (parent, toks)
                parent = h
        print(f"prompts: {len(gpu)} device blocks, hashes recomputed from token ids")

        # 2. Enough distinct prompts to overflow 40 device blocks: evictions
        #    (BlockRemoved GPU) and demotions (BlockStored CPU), and the CPU
        #    tier's own evictions once it is full.
        for i in range(12):
            complete(f"Letter {i}: " + f"Captain Wentworth wrote {i} times to Anne. " * 8)
        dev, cpu = check_against_metrics()
        assert live.kinds.get("BlockRemoved", 0) > 0, live.kinds
        assert len(live.medium("CPU")) > 0, "no demotion to the CPU tier was reported"
        print(f"eviction: {dev} device, {cpu} cpu cached; events {live.kinds}")

        # 3. A prompt whose blocks now live only on the CPU tier comes back
        #    (promotion: BlockStored GPU for blocks also held as CPU).
        ids0 = prompt_ids(texts[0])
        h0 = block_hash(None, tuple(ids0[:BS]))
        before = (h0, "GPU") in live.blocks
        complete(texts[0])
        check_against_metrics()
        assert (h0, "GPU") in live.blocks
        print(f"re-sent prompt 0 (its first block was {'on' if before else 'off'} the device)")

        # 4. A late joiner: replay from sequence 0 rebuilds the same set.
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        late = Follower(ctx, f"tcp://127.0.0.1:{pub_port}")
        n = 0
        while True:
            assert dealer.poll(5000), "no replay answer"
            frames = dealer.recv_multipart()
            assert frames[0] == b"" and len(frames) == 3, frames[:2]
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == -1:
                assert frames[2] == b""
                break
            late.apply(seq, frames[2])
            n += 1
        assert n == live.next_seq, (n, live.next_seq)
        assert late.blocks == live.blocks
        # ... and a replay from the middle starts there.
        mid = live.next_seq // 2
        dealer.send_multipart([b"", mid.to_bytes(8, "big")])
        frames = dealer.recv_multipart()
        assert int.from_bytes(frames[1], "big") == mid
        while int.from_bytes(dealer.recv_multipart()[1], "big", signed=True) != -1:
            pass
        print(f"replay: {n} batches rebuilt {len(late.blocks)} blocks, same as live")

        # 5. POST /reset_prefix_cache (the web console's admin route): every
        #    cached block is removed on both tiers, then AllBlocksCleared.
        dev, cpu = check_against_metrics()
        assert dev + cpu > 0
        removed0 = live.kinds.get("BlockRemoved", 0)
        st, body = kvs.http("POST", srv.url + "/reset_prefix_cache", {},
                            headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert st == 200 and body == {"reset": True, "blocks_freed": dev + cpu}, (st, body)
        assert check_against_metrics() == (0, 0)
        assert live.kinds.get("AllBlocksCleared", 0) == 1, live.kinds
        assert live.kinds["BlockRemoved"] > removed0
        assert not live.blocks
        print(f"reset_prefix_cache: {dev + cpu} blocks freed, AllBlocksCleared published")
        dealer.close(0)
        late.sub.close(0)
        live.sub.close(0)
    finally:
        rc = srv.stop()
        ctx.destroy(linger=0)
    assert rc == 0, f"kvserve exited {rc}"
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
