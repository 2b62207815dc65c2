"""The cross-op bad-input grid (docs/numerics.md, "Input policy"): every class of bad input x
every public op, builder, host helper and device wrapper entry check. ``table.py`` holds the
valid base calls and the argument roles, ``corrupt.py`` the corruptions, ``test_grid.py`` the
tests."""
