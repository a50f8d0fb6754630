"""cadence.disagg"""
