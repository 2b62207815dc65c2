"""Kernels that exist only to measure or exercise the machinery: the matmul-only probes of the
decode kernels and the smoke kernel of the simulator. Not part of the installed package."""
