"""Triton kernels for the GPU path; each module holds one kernel family and its launcher."""
