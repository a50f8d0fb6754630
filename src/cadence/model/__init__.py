"""cadence.model"""
