"""What the goldens compute with and run on, shared by more than one golden.

The arithmetic models and rounding points (:mod:`~tilesim.reference.util.arith`,
:mod:`~tilesim.reference.util.numerics`), the BLAS threads and worker pool
(:mod:`~tilesim.reference.util.blas_pool`), the progress bar
(:mod:`~tilesim.reference.util.progress`) and the family helpers several goldens read
(:mod:`~tilesim.reference.util.msa_common`, :mod:`~tilesim.reference.util.dsa_gather`,
:mod:`~tilesim.reference.util.moe_routing`). An op's golden itself is ``reference/<op>.py``.
"""
