"""cadence.bench: load generator, streaming client, latency metrics, interference report, sweeps (see README.md)."""
