"""The registry of ops and the schemas every registry reader shares: the op record
(:mod:`~tilesim.shared.registry.op_record`), the ordered list of records and what is derived
from it (:mod:`~tilesim.shared.registry.ops`), the case-dict schema
(:mod:`~tilesim.shared.registry.case_schema`) and the one tolerance validator
(:mod:`~tilesim.shared.registry.tolerance`). An op's own contract and record are
``shared/<op>.py``.
"""
