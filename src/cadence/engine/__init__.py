"""cadence.engine"""
