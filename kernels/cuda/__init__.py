"""CUDA C++ families (kind ``cuda``): nvcc compile facts (``nvcc``), the driver launch on a GPU (``launch``),
bubblewrap confinement of nvcc and the GPU child (``confine``), the rules on nvcc's preprocessed unit
(``tokens``, ``rules``), the GPU stage's cases and child (``gpu_child``), and the built-in ``gemm_fp8_cuda``
family (``gemm_fp8_cuda.py`` + ``gemm_fp8_cuda.cu``). docs/cuda.md says what the confinement allows."""
