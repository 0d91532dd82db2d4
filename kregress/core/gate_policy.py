"""The static policy's tables: what added code may reference (builtins, modules, torch and Triton names,
attributes) and the rules a finding names; ``kregress.core.gate`` walks the code with them. One rule is a
function of its own, ``launch_value_uses``: it needs the statement a launch stands in, not a table."""

from __future__ import annotations

import ast

# --- what added code may reference ------------------------------------------------------------------

# Builtins kernel code and launch wrappers use. Anything else (getattr, eval, open, id, type, vars, ...) is refused.
ALLOWED_BUILTINS = frozenset({
    "range", "min", "max", "abs", "int", "float", "bool", "len", "tuple", "list", "dict", "set", "isinstance",
    "round", "enumerate", "zip", "any", "all", "sum", "map", "filter", "sorted", "reversed", "str", "print",
    "divmod", "pow", "ValueError", "TypeError", "RuntimeError", "AssertionError", "NotImplementedError",
    "KeyError", "IndexError", "None", "True", "False", "slice",
})
BANNED_BUILTINS = {
    "getattr": "dynamic_code", "setattr": "dynamic_code", "delattr": "dynamic_code", "hasattr": "dynamic_code",
    "eval": "dynamic_code", "exec": "dynamic_code", "compile": "dynamic_code", "__import__": "dynamic_code",
    "globals": "introspection", "locals": "introspection", "vars": "introspection", "dir": "introspection",
    "open": "file_io", "input": "file_io", "breakpoint": "introspection", "id": "cache_by_identity",
    "hash": "cache_by_identity", "type": "introspection", "object": "introspection", "super": "introspection",
    "memoryview": "introspection", "callable": "introspection", "issubclass": "introspection",
    "classmethod": "tensor_subclass", "staticmethod": "tensor_subclass", "property": "tensor_subclass",
    "exit": "process", "quit": "process", "help": "introspection", "iter": "introspection", "next": "introspection",
}

# Module roots added code may not touch at all, and the rule that says why.
BANNED_MODULES = {
    "os": "environment", "sys": "environment", "platform": "environment", "sysconfig": "environment",
    "site": "environment", "inspect": "introspection", "gc": "introspection", "traceback": "introspection",
    "dis": "introspection", "types": "introspection", "weakref": "introspection", "code": "dynamic_code",
    "threading": "concurrency", "_thread": "concurrency", "multiprocessing": "concurrency",
    "concurrent": "concurrency", "asyncio": "concurrency", "sched": "concurrency",
    "subprocess": "process", "pty": "process", "signal": "process", "atexit": "process", "resource": "process",
    "ctypes": "native", "cffi": "native", "_ctypes": "native", "mmap": "native",
    "socket": "network", "ssl": "network", "http": "network", "urllib": "network", "requests": "network",
    "select": "network", "selectors": "network",
    "importlib": "dynamic_code", "builtins": "dynamic_code", "pickle": "dynamic_code", "marshal": "dynamic_code",
    "io": "file_io", "pathlib": "file_io", "shutil": "file_io", "tempfile": "file_io", "glob": "file_io",
    "time": "timer", "timeit": "timer", "datetime": "timer",
    "numpy": "torch_compute", "scipy": "torch_compute", "operator": "torch_compute", "functools": "module_state",
    "random": "environment", "warnings": "environment", "logging": "file_io",
}

# torch.<name> that allocate or describe (no arithmetic): everything else under torch computes or
# reaches for machinery kernel code never needs.
TORCH_ALLOWED = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full", "full_like", "ones", "ones_like",
    "arange", "Size", "device", "dtype", "Tensor", "is_tensor", "finfo", "iinfo", "float16", "bfloat16", "float32",
    "float64", "half", "float", "double", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "bool", "long", "int", "short", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e8m0fnu", "contiguous_format", "strided",
})
TORCH_ENVIRONMENT = frozenset({"version", "get_num_threads", "are_deterministic_algorithms_enabled", "get_default_dtype",
                               "is_deterministic_algorithms_warn_only_enabled", "is_grad_enabled", "is_inference_mode_enabled",
                               "get_float32_matmul_precision", "get_default_device", "xpu", "mps", "hip", "backends"})
TRITON_ALLOWED = frozenset({"cdiv", "next_power_of_2", "jit", "heuristics", "language", "constexpr"})
TRITON_BANNED = {"testing": "timer", "runtime": "environment", "knobs": "environment", "compiler": "environment",
                 "backends": "environment", "tools": "environment", "autotune": "decorator", "Config": "decorator",
                 "profiler": "timer", "instrumentation": "environment"}
TL_BANNED = {"inline_asm_elementwise": "inline_asm", "globaltimer": "timer", "clock": "timer", "clock64": "timer",
             "smid": "environment"}
# Modules the allowed roots re-export (triton.language.core imports builtins, inspect, triton.knobs, ...): a chain
# through one of these names reaches that module. Used when no resolver is given (the judge passes one that asks
# the real module objects, so a re-export added by a later Triton is found too).
REEXPORTED = {"builtins": "builtins", "inspect": "inspect", "knobs": "triton.knobs", "pkgutil": "pkgutil",
              "typing": "typing", "ir": "triton._C.libtriton.ir", "sys": "sys", "os": "os", "importlib": "importlib",
              "np": "numpy", "numpy": "numpy", "functools": "functools", "operator": "operator", "time": "time"}
ALLOWED_ROOTS = frozenset({"torch", "triton", "math"})  # modules kernel code may reach (and their submodules)

# Tensor methods that compute: a wrapper that calls them computes with torch instead of its kernel.
COMPUTE_METHODS = frozenset({
    "matmul", "mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "mv", "dot", "vdot", "inner", "outer", "ger",
    "einsum", "tensordot", "kron", "matrix_power", "chain_matmul", "linear", "bilinear", "conv1d", "conv2d",
    "softmax", "log_softmax", "exp", "exp2", "expm1", "log", "log2", "log1p", "sigmoid", "tanh", "relu", "gelu",
    "silu", "sum", "nansum", "mean", "prod", "cumsum", "cumprod", "max", "min", "amax", "amin", "argmax", "argmin",
    "logsumexp", "norm", "sqrt", "rsqrt", "pow", "square", "mul", "multiply", "add", "sub", "subtract", "div",
    "divide", "true_divide", "floor_divide", "remainder", "fmod", "clamp", "clip", "where", "masked_fill",
    "masked_scatter", "index_add", "index_copy", "index_put", "scatter", "scatter_add", "scatter_reduce", "gather",
    "lerp", "addcmul", "addcdiv", "sort", "topk", "kthvalue", "median", "var", "std", "cross", "diff", "trapz",
    "numpy", "tolist", "scaled_dot_product_attention", "neg", "reciprocal", "abs", "sign", "round", "floor", "ceil",
    "maximum", "minimum", "fmax", "fmin", "logaddexp", "hypot", "atan2", "polar", "bitwise_and", "bitwise_or",
    "bitwise_xor", "repeat_interleave", "apply_", "map_", "map2_", "register_hook", "backward",
})
# Tensor data read into Python, or Python data made into tensors: host-side compute and value sniffing.
HOST_DATA_ATTRS = frozenset({"tolist", "numpy", "item", "new_tensor", "as_tensor", "from_numpy", "frombuffer",
                             "to_dlpack", "from_dlpack", "asarray"})
MUTATORS = frozenset({"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "remove",
                      "add", "discard", "sort", "reverse", "__setitem__"})
DEVICE_SNIFF_ATTRS = frozenset({"is_cuda", "is_cpu", "is_meta", "is_xpu", "is_mps", "device_type", "get_device",
                                "is_available", "device_count", "get_device_name", "get_device_properties"})
IDENTITY_ATTRS = frozenset({"data_ptr", "_cdata", "storage", "untyped_storage", "storage_offset", "_version"})
FRAME_ATTRS = frozenset({"f_back", "f_locals", "f_globals", "f_code", "f_builtins", "gi_frame", "cr_frame",
                         "ag_frame", "tb_frame", "tb_next", "f_lineno", "co_code", "co_consts", "func_globals",
                         "func_code"})
FIXED_ATTRS = frozenset({"reference", "make_inputs", "tolerance", "compile_units", "space", "check_shape",
                         "model_latency_ms", "lookup"})  # the family object's fixed parts
JIT_INTERNAL_ATTRS = frozenset({"handle", "data", "numpy", "tolist"})  # interpreter-only escapes from kernel code
SNIFF_STRINGS = ("TRITON_", "INTERPRET", "PYTEST", "KREGRESS", "CUDA_VISIBLE", "SANDBOX")
DEVICE_STRINGS = frozenset({"cpu", "cuda", "meta", "hip", "xpu", "mps"})  # a device named in code: a device test
JIT_BUILTINS = frozenset({"range", "min", "max", "float", "int", "len", "print", "abs", "bool", "tuple", "zip",
                          "enumerate"})
JIT_DECORATOR_KWARGS = frozenset({"do_not_specialize", "do_not_specialize_on_alignment", "noinline", "debug"})
TORCH_CUDA_ALLOWED = frozenset({"device"})  # `with torch.cuda.device(x.device):` in a wrapper
# Builtins that turn any object into text: of a module-level object (a kernel: JITFunction or the
# interpreter's InterpretedFunction) the text tells who runs it.
TEXT_BUILTINS = frozenset({"str", "repr", "ascii", "format", "print"})

RULES = {
    "torch_compute": "computes with torch (or numpy) instead of the kernel",
    "reference": "reads the family's fixed code (reference, inputs, registry) that the kernel does not use",
    "try_except": "try/except (a hidden fallback)",
    "introspection": "introspection (inspect, frames, globals/locals, dunder attributes)",
    "concurrency": "threads, processes, async, CUDA streams or events",
    "process": "runs or signals processes",
    "native": "native code (ctypes, cffi, mmap)",
    "network": "sockets and network",
    "file_io": "file I/O",
    "environment": "reads or changes the environment, the interpreter or the device",
    "timer": "the timer (time, triton.testing / do_bench)",
    "dynamic_code": "dynamic code (eval, exec, getattr tricks, __import__, importlib, builtins)",
    "import": "an import in kernel code",
    "tensor_subclass": "defines a class (Tensor subclass)",
    "module_state": "keeps state outside the call (attribute or item assignment, globals, mutated module objects)",
    "mutates_input": "changes an input in place",
    "cache_by_identity": "reads buffer identity (data_ptr, id, hash): results cached by pointer",
    "unknown_name": "a name that is neither local, a kernel, an allowed builtin nor a module the kernel uses",
    "jit_call": "kernel code calls a Python function (the interpreter would run it as Python)",
    "interpreter_internals": "kernel code reaches into the interpreter's values",
    "inline_asm": "inline assembly (cannot be checked on a CPU host)",
    "kernel_not_jit": "a kernel is no longer @triton.jit",
    "entry_signature": "the entry point's signature or decorators changed",
    "no_launch": "the entry point no longer launches its kernel",
    "decorator": "a decorator other than triton.jit / triton.heuristics",
    "context_manager": "a with-block other than torch.cuda.device",
    "identity": "an identity test (`is`) on values: which object a call returns tells where it runs",
    "host_data": "reads tensor data into Python or builds tensors from Python data (host-side compute)",
    "kernel_object": "looks into a module-level object (a kernel, a function): its attributes are state every call shares",
    "launch_value": "uses the value a kernel launch returns (the compiled kernel on a GPU, a stand-in on the CPU "
                    "interpreter): it tells who runs the kernel; launch as a statement (`kernel[grid](...)`)",
}


def launch_value_uses(fn: ast.AST, changed: set[int]) -> list[tuple[int, str]]:
    """(line, code) of every launch in ``fn`` (a function's syntax tree) on a ``changed`` line whose value is
    used: a call of an indexed object (``kernel[grid](...)``, whatever ``kernel`` names: a local alias is a
    launch too) that is not a statement of its own. Assigned (``h = ...``, ``h: T = ...``, ``h += ...``), in a
    walrus, compared (``... is None``), passed (``f(k[g](...))``, ``bool(...)``), branched on (``if``,
    ``while``, ``assert``, a conditional expression, ``and``/``or``), returned, yielded, put in a container
    or a lambda's body: each reads the handle the compiled launch returns, which the interpreter cannot
    reproduce (kernels/interpreter.py's ``LaunchHandle``)."""
    parent = {c: p for p in ast.walk(fn) for c in ast.iter_child_nodes(p)}
    out: list[tuple[int, str]] = []
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)):
            continue
        lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        if not any(n in changed for n in lines) and not any(
                n in changed for n in range(getattr(parent.get(node), "lineno", 0) or 0,
                                            (getattr(parent.get(node), "end_lineno", 0) or 0) + 1)):
            continue
        if isinstance(parent.get(node), ast.Expr):
            continue
        out.append((node.lineno, ast.unparse(parent.get(node, node))[:80]))
    return out
