"""``cosmos-sana`` subcommands: one module each, with ``add_arguments`` and ``run``."""
