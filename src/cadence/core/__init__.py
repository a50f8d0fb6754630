"""Decision layer: requests, block pool, prefix cache, scheduler, policies. Pure Python, no torch."""
