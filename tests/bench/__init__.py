"""Benchmark of the NumPy references — a development tool, not part of the installed package.

Run from ``tests/`` (``cd tests && python -m bench --help``) or through ``nox -s bench``. For
each family, on the seeds' named cases, measured in one run:

* the reference's wall time (the ``tilesim.reference`` op on the case's inputs, what
  ``tilesim golden`` runs);
* a plain torch golden written the way the seeds' tests write theirs (:mod:`bench.goldens`),
  checked against the reference with the case's tolerance so the timing compares like with
  like;
* the FLOP roofline: the op's FLOP count (:mod:`bench.flops`) divided by this machine's
  measured sgemm rate (:mod:`bench.timing`);
* peak memory (``ru_maxrss``) and wall time of the DeepSeek b64 s2 64K golden and of the
  b4 s2 64K layer step on both paths, each built and run in a fresh subprocess.

Writes ``reference.md`` and ``reference.png`` (:mod:`bench.report`) into ``--out`` (default
``build/perf/`` of the checkout; the nox session copies them into ``docs/perf/``).
"""
