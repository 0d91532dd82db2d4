"""The GPU path of a CUDA family: the cubin nvcc built (``kernels.cuda.nvcc``) loaded and launched through
the CUDA driver API, from cuda-python (``cuda.bindings.driver``), on torch's current stream.

Why the driver and not ``torch.utils.cpp_extension.load_inline``: what is checked and timed is the very
cubin whose registers, spills and shared memory the compile recorded (same bytes, same cache entry); a
variant costs one ``nvcc -cubin`` (about a second) instead of a torch-extension build with the host
compiler and torch's headers per template instance (tens of seconds each); nothing must match torch's C++
ABI; and the host wrapper stays Python, like every family's, so the correctness and timing path is the
one every family takes. The driver's primary context is the one torch uses, so tensors' pointers are
valid in it.

Only a GPU host imports this module (``run`` of a CUDA family); nothing here runs on a CPU host.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from kernels.cuda.nvcc import compile_unit
from kregress.core.family import CudaFamily, CudaUnit

STATIC_SMEM_LIMIT = 48 * 1024  # above it a launch must opt in (cuFuncSetAttribute)


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6
        except ImportError:
            raise RuntimeError("launching a CUDA family's cubin needs cuda-python: pip install cuda-bindings "
                               "(in kregress's [cuda] extra)") from None
    return driver


def _check(driver: Any, what: str, res: Any) -> Any:
    err, rest = (res[0], res[1:]) if isinstance(res, tuple) else (res, ())
    if err != driver.CUresult.CUDA_SUCCESS:
        name = driver.cuGetErrorName(err)
        label = name[1].decode() if isinstance(name, tuple) and len(name) > 1 and isinstance(name[1], bytes) else str(err)
        raise RuntimeError(f"{what} failed: {label}")
    return rest[0] if len(rest) == 1 else rest


@dataclass
class LoadedKernel:
    """A kernel function of a loaded cubin: ``launch(grid, args)`` on torch's current stream."""

    unit: CudaUnit
    entry: str
    function: Any
    module: Any
    image: Any  # the cubin's bytes, kept alive with the module

    def launch(self, grid: tuple[int, int, int], args: list[Any]) -> None:
        """Launch on ``grid`` blocks of ``unit.threads``; ``args`` in the kernel's parameter order: tensors
        (their device pointer), Python ints (int32) and floats (float32)."""
        import numpy as np
        import torch

        driver = _driver()
        holders = []
        for a in args:
            if torch.is_tensor(a):
                holders.append(np.array([a.data_ptr()], dtype=np.uint64))
            elif isinstance(a, bool) or not isinstance(a, (int, float)):
                raise TypeError(f"{self.unit.kernel}: argument {a!r} is neither a tensor, an int nor a float")
            elif isinstance(a, int):
                holders.append(np.array([a], dtype=np.int32))
            else:
                holders.append(np.array([a], dtype=np.float32))
        pointers = np.array([h.ctypes.data for h in holders], dtype=np.uint64)
        stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
        gx, gy, gz = (max(1, int(g)) for g in grid)
        _check(driver, f"cuLaunchKernel({self.entry})",
               driver.cuLaunchKernel(self.function, gx, gy, gz, self.unit.threads, 1, 1, self.unit.dynamic_smem_bytes,
                                     stream, pointers.ctypes.data, 0))


_LOADED: dict[tuple, LoadedKernel] = {}
_LOCK = threading.Lock()


def device_arch(device: Any = None) -> str:
    """``sm_90`` for the current (or given) CUDA device."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def kernel_for(family: CudaFamily, unit: CudaUnit) -> LoadedKernel:
    """``unit`` compiled for the current device's arch (cached on disk) and loaded once per process and device."""
    import numpy as np
    import torch

    device = torch.cuda.current_device()
    arch = device_arch(device)
    key = (family.name, unit, arch, device)
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        build = compile_unit(family, unit, arch)
        driver = _driver()
        torch.cuda.init()
        torch.empty(1, device="cuda")  # torch has made its (the primary) context current on this thread
        _check(driver, "cuInit", driver.cuInit(0))
        ctx = _check(driver, "cuCtxGetCurrent", driver.cuCtxGetCurrent())
        if not int(ctx):
            dev = _check(driver, "cuDeviceGet", driver.cuDeviceGet(device))
            ctx = _check(driver, "cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(dev))
            _check(driver, "cuCtxSetCurrent", driver.cuCtxSetCurrent(ctx))
        image = np.frombuffer(build.cubin, dtype=np.uint8).copy()
        module = _check(driver, f"cuModuleLoadData({build.entry})", driver.cuModuleLoadData(image.ctypes.data))
        fn = _check(driver, f"cuModuleGetFunction({build.entry})", driver.cuModuleGetFunction(module, build.entry.encode()))
        if unit.dynamic_smem_bytes > STATIC_SMEM_LIMIT:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(driver, "cuFuncSetAttribute", driver.cuFuncSetAttribute(fn, attr, unit.dynamic_smem_bytes))
        loaded = LoadedKernel(unit=unit, entry=build.entry, function=fn, module=module, image=image)
        _LOADED[key] = loaded
        return loaded
