"""cadence.bench"""
