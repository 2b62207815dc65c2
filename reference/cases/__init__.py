"""The case builders of :mod:`tilesim.reference`, one module per case family.

``cases/<family>.py`` builds the family's named and random cases (``<family>_make_case``,
the family's ``CASE_INFO``); the families are the registry's
(:func:`tilesim.shared.registry.ops.families`, :func:`~tilesim.shared.registry.ops.case_builder`).
:mod:`~tilesim.reference.cases.dsa_common` holds what the DeepSeek-V3.2 families share. The
builders are exported by :mod:`tilesim.reference` under their own names.
"""
