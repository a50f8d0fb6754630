"""cadence.sim"""
