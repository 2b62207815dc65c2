"""Where the data sits: the byte layouts of the DeepSeek-V3.2 caches
(:mod:`~tilesim.shared.layouts.mla_cache`, :mod:`~tilesim.shared.layouts.index_cache`), the one
slot rule of the paged caches (:mod:`~tilesim.shared.layouts.slots`), the rows and the INT32
index tensor a sparse-attention query reads (:mod:`~tilesim.shared.layouts.dsa_rows`,
:mod:`~tilesim.shared.layouts.dsa_kernel_index`), and how a key loop is cut into splits
(:mod:`~tilesim.shared.layouts.splitkv`, :mod:`~tilesim.shared.layouts.dsa_split_rule`).
Derived once here; goldens, wrappers, kernels and case builders read them.
"""
