"""Reward runtime: combine components, schedule scoring, serve and fetch scores remotely.

The scorers themselves are plugins (``cosmos_sana_rewards`` hook); this package
builds them from ``[[custom.rewards]]`` and runs them.
"""
