"""Layer 7, the faces: they may use everything and nothing below imports them.

Benchmarks and cost reports ([`bench`][minispec.tools.bench], [`costs`][minispec.tools.costs],
[`workloads`][minispec.tools.workloads]), which time through one module
([`lockstep`][minispec.tools.lockstep]) and write and read their records through one other
([`records`][minispec.tools.records]), pictures ([`viz`][minispec.tools.viz]), the command
line (``python -m minispec --help``), and the training recipes of the shipped models
(``python -m minispec.tools.train``, ``python -m minispec.tools.train_eagle``).
"""
