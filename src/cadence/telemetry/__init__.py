"""cadence.telemetry"""
