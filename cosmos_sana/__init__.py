"""cosmos-sana: post-train SANA and SANA-Video with NVIDIA cosmos-rl.

Importing this package is cheap on purpose: the autoload hook imports it in
every cosmos-rl process, so heavy modules (torch, diffusers) load lazily.
"""

__version__ = "0.1.0"
