"""The disaggregation router: an OpenAI-compatible front end over prefill and decode workers.

    config.py    RouterConfig (flags of `cadence router`)
    workers.py   the worker pools: least outstanding tokens, health, measured queue depths
    policy.py    colocated or disaggregated, per request (auto: a measured cost model)
    forward.py   HTTP calls to workers: the prefill handoff, relaying the decode stream, faults
    app.py       the FastAPI app and `cadence router`'s entry
"""
