"""Built-in rollout plugin: the colocated ``sana`` rollout, best-of-n and reward submission."""
