"""Compile checks of the Triton kernels: the launch listing and the ahead-of-time compile for sm_80 / sm_90."""
