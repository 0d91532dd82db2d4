"""CUDA C++ families (kind ``cuda``): nvcc compile facts (``nvcc``), the driver launch on a GPU (``launch``),
and the built-in ``gemm_fp8_cuda`` family (``gemm_fp8_cuda.py`` + ``gemm_fp8_cuda.cu``)."""
