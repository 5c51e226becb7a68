"""Reward combination and scheduling (the scorers themselves are plugins)."""
