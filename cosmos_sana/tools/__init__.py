"""Tools beside the library: the offline wheelhouse builder and the tiny random-weight SANA pipelines.

Nothing in the training, export or reward paths imports them; the ``wheelhouse``, ``make-tiny`` and
``demo`` commands, the tests and the benchmarks do.
"""
