"""cadence.executor"""
