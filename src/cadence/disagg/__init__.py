"""Prefill/decode disaggregation: worker roles, KV transfer between engines, and the router.

    kv_blocks.py    a KV cache's blocks as zero-copy byte frames, and back into another cache
    transport.py    KVTransport (the pull/release interface) and its ZeroMQ implementation
    leases.py       the prefill side's leased blocks, shared with the transport's server thread
    kv_puller.py    the decode side's transfer thread (pulls, acknowledges)
    worker.py       DisaggEngineCore: an engine with a role (prefill | decode | both)
    router/         the OpenAI-compatible router: policy, balancing, forwarding, faults
    launcher.py     `cadence serve --disagg P:D`: local worker processes + the router
    ray_backend.py  the same workers as Ray actors (`--distributed-executor-backend ray`)
"""
