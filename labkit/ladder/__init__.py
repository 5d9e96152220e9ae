"""The tuning ladder: one job made faster rung by rung, each rung measured (notebook 10).
"""
