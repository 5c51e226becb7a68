"""cosmos-sana's built-in plugins (SANA model adapter, datasets, rewards, trainers, rollout).

Installed under the import name ``cosmos_sana_plugins`` and declared in
``pyproject.toml`` through the ``cosmos_sana.plugins`` entry-point group, exactly
like a third-party plugin package.
"""
