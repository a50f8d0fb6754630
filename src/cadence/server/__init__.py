"""cadence.server"""
