"""Triton kernels for the relaxed operators, installed as ``diffrank.kernels``."""
