import os as _os

if _os.environ.get("TRITON_INTERPRET") == "1":
    # Any process that runs kernels in Triton's CPU interpreter gets its fixes first (the worker,
    # a test's child process, a plugin's check): see kernels/interpreter.py.
    from kernels.interpreter import install as _install

    _install()
