"""The gate a candidate patch goes through, as pure decisions with causes (no torch, no Triton).

Order (each stage puts its cause on the verdict):

1. static (REGRESS ``rejected``): ``static_findings`` walks the syntax tree of the added and changed
   code of every patched file and refuses what a kernel edit never needs and a cheat does: torch
   compute or the family's reference instead of the kernel (``@``, matmul/mm/bmm/einsum,
   ``torch.nn.functional``, ``torch.ops``, any torch call that computes), try/except, introspection
   (inspect, frames, ``globals()``/``locals()``, dunder attributes), threads and processes, ctypes,
   sockets, file I/O, the environment and the interpreter/device (``os.environ``, ``is_cuda``, Triton's
   knobs), CUDA streams and events, the timer (``triton.testing``, ``time``), dynamic code
   (``eval``, ``getattr``, ``__import__``, ``importlib``), imports, classes (Tensor subclasses),
   attribute and item assignment and in-place changes of inputs or globals (module-level state);
   and it requires the kernels to stay ``@triton.jit`` and launched by the unchanged entry point.
   Module chains are judged by the module they really reach: ``tl.core.builtins.exec`` is ``builtins.exec``
   (a ``resolve`` callable from the caller, which may import, names the module a dotted name stands for).
   What a value is checked by never matters more than how it can be used: a device may only be passed on
   (``device=``) or compared where a mismatch raises; an object aliased from an argument or a module-level
   object may not be mutated; module-level objects (kernels, functions) are only called or launched, never
   looked into; tensor data is never read into Python (``tolist``, ``numpy``, ``item``) nor built from it.
   Each finding names its rule, file and line.
2. sandbox and 3. correctness (REGRESS ``wrong``) run elsewhere (``kernels/sandbox.py``,
   ``kernels/candidate.py``); their outcome is a ``GateReport``.
4. precision (NEEDS_REVIEW ``precision``): ``precision_finding``: an error several times the
   baseline's own on the same inputs, even within tolerance.
5. plausibility (NEEDS_REVIEW ``implausible``, never PASS): ``plausibility_findings``: faster than
   the family's speed of light (its FLOPs and bytes at the spec's peaks) or more than a factor faster
   than the baseline.
6. then the usual verdict (slower, infeasible, PASS): ``gate_verdict`` returns None and the caller's rule decides.
"""

from __future__ import annotations

import ast
from typing import Any, Callable

from kregress.core.family import is_jit_decorator, is_jit_def
from kregress.core.gate_facts import FileFacts, _is_literal, _locals_of, _own_lines, _params_of, dotted, file_facts, region_usage  # noqa: F401
from kregress.core.gate_policy import (  # noqa: F401 - the tables, re-exported for the walker's readers
    ALLOWED_BUILTINS,
    ALLOWED_ROOTS,
    BANNED_BUILTINS,
    BANNED_MODULES,
    COMPUTE_METHODS,
    DEVICE_SNIFF_ATTRS,
    DEVICE_STRINGS,
    FIXED_ATTRS,
    FRAME_ATTRS,
    HOST_DATA_ATTRS,
    IDENTITY_ATTRS,
    JIT_BUILTINS,
    JIT_DECORATOR_KWARGS,
    JIT_INTERNAL_ATTRS,
    MUTATORS,
    REEXPORTED,
    RULES,
    SNIFF_STRINGS,
    TEXT_BUILTINS,
    TL_BANNED,
    TORCH_ALLOWED,
    TORCH_CUDA_ALLOWED,
    TORCH_ENVIRONMENT,
    TRITON_ALLOWED,
    TRITON_BANNED,
    launch_value_uses,
)
from kregress.core.gate_report import (  # noqa: F401 - re-exported: the record lives in gate_report
    PRECISION_FLOOR_MAX,
    PRECISION_FLOOR_RMS,
    GateReport,
    PrecisionMetrics,
    plausibility_findings,
    precision_finding,
)
from kregress.core.patch import Finding, regions_of
from kregress.core.source_tree import parse_source

# --- the static policy -----------------------------------------------------------------------------


class _Walker:
    """Checks the changed nodes of one editable function."""

    def __init__(self, file: str, facts: FileFacts, fn: ast.FunctionDef, changed: set[int], jit: bool,
                 all_jit: set[str], out: list[Finding], resolver: Callable[[str], str | None] | None = None):
        self.file, self.facts, self.fn, self.changed, self.jit = file, facts, fn, changed, jit
        self.all_jit = all_jit
        self.out = out
        self.resolver = resolver
        self.local = _locals_of(fn)
        self.params = _params_of(fn)
        self.parent = {c: p for p in ast.walk(fn) for c in ast.iter_child_nodes(p)}
        self.seen: set[tuple[str, int]] = set()
        self.aliased, self.device_locals = self._aliases()
        self.objects = self._object_aliases()

    # -- what a local name holds
    def _global_object(self, n: str) -> bool:
        """A module-level object that is not a module (a kernel, a function, an imported object, a table)."""
        f = self.facts
        return n not in self.local and n not in f.aliases and (
            n in self.all_jit or n in f.functions or n in f.imported_objects or n in f.other_globals
            or n in f.constants or n in f.wrappers)

    def _outlives_call(self, node: ast.AST, aliased: set[str]) -> bool:
        """Whether ``node`` evaluates to an object that outlives the call: an argument, a module-level object,
        something reached from one (attribute, item, method result), or a container holding one. A call of a
        builtin or a module function (``dict(config)``, ``torch.empty(...)``) makes a fresh object."""
        if isinstance(node, ast.Name):
            return node.id in aliased or node.id in self.params or self._global_object(node.id)
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            return self._outlives_call(node.value, aliased)
        if isinstance(node, ast.Call):
            # a method of an outliving object may hand back part of it (config.setdefault("memo", {}))
            f = node.func
            return isinstance(f, ast.Attribute) and not self._is_module_chain(f) and self._outlives_call(f.value, aliased)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return any(self._outlives_call(e, aliased) for e in node.elts)
        if isinstance(node, ast.Dict):
            return any(self._outlives_call(v, aliased) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self._outlives_call(node.body, aliased) or self._outlives_call(node.orelse, aliased)
        if isinstance(node, ast.BoolOp):
            return any(self._outlives_call(v, aliased) for v in node.values)
        if isinstance(node, ast.NamedExpr):
            return self._outlives_call(node.value, aliased)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return self._outlives_call(node.elt, aliased | self._comp_targets(node, aliased))
        if isinstance(node, ast.DictComp):
            return self._outlives_call(node.value, aliased | self._comp_targets(node, aliased))
        return False

    def _comp_targets(self, node: ast.AST, aliased: set[str]) -> set[str]:
        out = set()
        for g in getattr(node, "generators", []):
            if self._outlives_call(g.iter, aliased):
                out |= {n.id for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        return out

    def _is_module_chain(self, node: ast.AST) -> bool:
        ch = dotted(node)
        return ch is not None and ch[0].split(".")[0] in self.facts.aliases and ch[0].split(".")[0] not in self.local

    def _aliases(self) -> tuple[set[str], set[str]]:
        """(local names bound to objects that outlive the call, local names bound to a tensor's device)."""
        binds: list[tuple[ast.AST, ast.AST]] = []
        for n in ast.walk(self.fn):
            if isinstance(n, ast.Assign):
                binds += [(t, n.value) for t in n.targets]
            elif isinstance(n, (ast.AnnAssign, ast.NamedExpr)) and n.value is not None:
                binds.append((n.target, n.value))
            elif isinstance(n, (ast.For, ast.comprehension)):
                binds.append((n.target, n.iter))
            elif isinstance(n, ast.withitem) and n.optional_vars is not None:
                binds.append((n.optional_vars, n.context_expr))
        aliased: set[str] = set()
        for _ in range(8):
            grown = False
            for target, value in binds:
                if self._outlives_call(value, aliased):
                    for t in ast.walk(target):
                        if isinstance(t, ast.Name) and t.id not in aliased and t.id not in self.params:
                            aliased.add(t.id)
                            grown = True
            if not grown:
                break
        devices = {t.id for target, value in binds for t in [target]
                   if isinstance(t, ast.Name) and isinstance(value, ast.Attribute) and value.attr == "device"}
        return aliased, devices

    def _bindings(self) -> list[tuple[ast.AST, ast.AST]]:
        """(target, value) of every binding in the function: assignments (chains and tuple unpacking
        included), walrus, for and comprehension targets, with-items, and the defaults of nested
        functions and lambdas (a default binds its parameter)."""
        binds: list[tuple[ast.AST, ast.AST]] = []
        for n in ast.walk(self.fn):
            if isinstance(n, ast.Assign):
                binds += [(t, n.value) for t in n.targets]
            elif isinstance(n, (ast.AnnAssign, ast.NamedExpr, ast.AugAssign)) and n.value is not None:
                binds.append((n.target, n.value))
            elif isinstance(n, (ast.For, ast.comprehension)):
                binds.append((n.target, n.iter))
            elif isinstance(n, ast.withitem) and n.optional_vars is not None:
                binds.append((n.optional_vars, n.context_expr))
            elif isinstance(n, (ast.Lambda, ast.FunctionDef)) and n is not self.fn:
                pos = n.args.posonlyargs + n.args.args
                binds += [(ast.Name(id=a.arg, ctx=ast.Store()), d) for a, d in zip(pos[len(pos) - len(n.args.defaults):], n.args.defaults)]
                binds += [(ast.Name(id=a.arg, ctx=ast.Store()), d) for a, d in zip(n.args.kwonlyargs, n.args.kw_defaults) if d is not None]
        return binds

    def _object_aliases(self) -> set[str]:
        """Local names that may hold a module-level object (a kernel, a function, an imported object, a
        table), through any chain of bindings: ``kk = gemm_kernel``, ``a, kk = 1, gemm_kernel``,
        ``(kk := gemm_kernel)``, ``for kk in (gemm_kernel,)``, ``lambda kk=gemm_kernel: ...``,
        ``f = lambda: gemm_kernel``. The kernel-object and private-attribute rules follow them."""
        binds = self._bindings()
        objs: set[str] = set()
        for _ in range(8):
            grown = False
            for target, value in binds:
                if self.holds_object(value, objs):
                    for t in ast.walk(target):
                        if isinstance(t, ast.Name) and t.id not in objs:
                            objs.add(t.id)
                            grown = True
            if not grown:
                break
        return objs

    def holds_object(self, node: ast.AST, objs: set[str] | None = None) -> bool:
        """Whether ``node`` may evaluate to (or contain, or be reached from) a module-level object that is
        not a module or a constant."""
        objs = self.objects if objs is None else objs
        if isinstance(node, ast.Name):
            f = self.facts
            if node.id in objs:
                return True
            return node.id not in self.local and node.id not in f.aliases and node.id not in f.constants and (
                node.id in self.all_jit or node.id in f.functions or node.id in f.imported_objects
                or node.id in f.other_globals or node.id in f.wrappers)
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            return self.holds_object(node.value, objs)
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Lambda):
                return self.holds_object(node.func.body, objs)
            if isinstance(node.func, ast.Name) and node.func.id in objs:
                return True
            return any(self.holds_object(a, objs) for a in list(node.args) + [k.value for k in node.keywords])
        if isinstance(node, ast.Lambda):
            return self.holds_object(node.body, objs)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return any(self.holds_object(e, objs) for e in node.elts)
        if isinstance(node, ast.Dict):
            return any(self.holds_object(v, objs) for v in node.values if v is not None)
        if isinstance(node, ast.IfExp):
            return self.holds_object(node.body, objs) or self.holds_object(node.orelse, objs)
        if isinstance(node, ast.BoolOp):
            return any(self.holds_object(v, objs) for v in node.values)
        if isinstance(node, ast.NamedExpr):
            return self.holds_object(node.value, objs)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return self.holds_object(node.elt, objs) or any(self.holds_object(g.iter, objs) for g in node.generators)
        if isinstance(node, ast.DictComp):
            return self.holds_object(node.value, objs) or any(self.holds_object(g.iter, objs) for g in node.generators)
        return False

    def hit(self, node: ast.AST) -> bool:
        return any(n in self.changed for n in _own_lines(node))

    def flag(self, rule: str, node: ast.AST, what: str) -> None:
        line = getattr(node, "lineno", None)
        key = (rule, line or 0)
        if key in self.seen:
            return
        self.seen.add(key)
        self.out.append(Finding(rule=rule, file=self.file, line=line, message=f"{what}: {RULES[rule]}"))

    # -- names and chains
    def resolve(self, name: str) -> str | None:
        """The dotted module (or imported object) a module-level name stands for, None for other names."""
        if name in self.local:
            return None
        if name in self.facts.aliases:
            return self.facts.aliases[name]
        if name in self.facts.imported_objects:
            return self.facts.imported_objects[name]
        return None

    def check_chain(self, chain: str, root: ast.Name, node: ast.AST) -> bool:
        """Rules for a dotted reference; True when it was judged (the caller does not look further)."""
        first, _, rest = chain.partition(".")
        if first in self.local:
            return False
        mod = self.resolve(first)
        if mod is None:
            return False
        full = f"{mod}.{rest}" if rest else mod
        parts = full.split(".")
        top = parts[0]
        if any(p.startswith("_") for p in parts[1:]):
            self.flag("introspection" if any(p.startswith("__") for p in parts) else "torch_compute" if top == "torch"
                      else "environment", node, f"`{chain}` (private attribute)")
            return True
        if top in ALLOWED_ROOTS:
            real = self._canonical(full)
            if real.split(".")[0] not in ALLOWED_ROOTS:
                reached = real.split(".")[0]
                self.flag(BANNED_MODULES.get(reached, "import"), node, f"`{chain}` reaches the module `{reached}`")
                return True
            if real != full:
                full, parts, top = real, real.split("."), real.split(".")[0]
            if self.resolver is not None and self.resolver(full) is not None and not isinstance(self.parent.get(node), ast.Attribute):
                self.flag("dynamic_code", node, f"the module `{chain}` used as a value")
                return True
        if top == "torch":
            sub = parts[1] if len(parts) > 1 else ""
            if not sub:
                return True
            if sub == "cuda":
                what = parts[2] if len(parts) > 2 else ""
                if what not in TORCH_CUDA_ALLOWED:
                    rule = "environment" if what in DEVICE_SNIFF_ATTRS or what in ("current_device", "is_initialized") else "concurrency"
                    self.flag(rule, node, f"`{chain}`")
                return True
            if sub in ("backends", "set_float32_matmul_precision", "set_default_dtype", "use_deterministic_algorithms",
                       "manual_seed", "seed", "set_num_threads", "set_grad_enabled"):
                self.flag("module_state", node, f"`{chain}`")
                return
            if sub in TORCH_ENVIRONMENT:
                self.flag("environment", node, f"`{chain}`")
                return True
            if sub in ("ops", "nn", "library", "autograd", "compile", "compiler", "jit", "fx", "func", "linalg",
                       "special", "fft", "sparse", "utils", "testing", "distributed", "multiprocessing", "profiler",
                       "hub", "overrides", "export") or sub not in TORCH_ALLOWED:
                rule = "timer" if sub in ("profiler",) else "concurrency" if sub in ("multiprocessing", "distributed") else "torch_compute"
                self.flag(rule, node, f"`{chain}`")
                return True
            if sub == "Tensor" and len(parts) > 2:
                self.flag("torch_compute", node, f"`{chain}`")
            return True
        if top == "triton":
            sub = parts[1] if len(parts) > 1 else ""
            if sub == "language":
                banned = [p for p in parts[2:] if p in TL_BANNED]
                if banned:
                    self.flag(TL_BANNED[banned[0]], node, f"`{chain}`")
                return True
            if sub and sub not in TRITON_ALLOWED:
                self.flag(TRITON_BANNED.get(sub, "environment"), node, f"`{chain}`")
            return True
        if top == "math":
            return True
        if top in BANNED_MODULES:
            self.flag(BANNED_MODULES[top], node, f"`{chain}`")
            return True
        # an object imported from another module (a jit helper, a constant): allowed when the kernel
        # already used it, or it is a jit function
        if first in self.facts.imported_objects:
            if first not in self.facts.used_by_region and first not in self.all_jit:
                self.flag("reference", node, f"`{first}`")
            elif rest:
                self.flag("kernel_object", node, f"`{chain}`")
            return True
        return False

    def _canonical(self, full: str) -> str:
        """``full`` with any prefix that is really another module replaced by that module's name
        (``triton.language.core.builtins.exec`` -> ``builtins.exec``)."""
        for _ in range(8):
            parts = full.split(".")
            new = full
            if self.resolver is not None:
                for i in range(len(parts), 1, -1):
                    real = self.resolver(".".join(parts[:i]))
                    if real is not None and real != ".".join(parts[:i]):
                        new = ".".join([real] + parts[i:])
                        break
            else:
                for i, p in enumerate(parts[1:], 1):
                    if p in REEXPORTED and not ".".join(parts[:i + 1]).startswith(REEXPORTED[p]):
                        new = ".".join([REEXPORTED[p]] + parts[i + 1:])
                        break
            if new == full:
                return full
            full = new
        return full

    def check_name(self, node: ast.Name) -> None:
        n = node.id
        if n in self.device_locals and not self._device_use_ok(node):
            self.flag("environment", node, f"`{n}` (a device) used other than passed on: {ast.unparse(self.parent.get(node, node))[:60]}")
            return
        if n in self.local:
            return
        if n.startswith("__"):
            self.flag("introspection", node, f"`{n}`")
            return
        if n in BANNED_BUILTINS:
            self.flag(BANNED_BUILTINS[n], node, f"`{n}`")
            return
        if "hook" in n.lower():
            self.flag("module_state", node, f"`{n}`: hook registration (code run on every launch)")
            return
        if n in self.facts.aliases:
            # a module may only be the base of an attribute chain (judged by check_chain); binding or
            # passing the module itself would hide what is called on it
            if not isinstance(self.parent.get(node), ast.Attribute):
                self.flag("dynamic_code", node, f"the module `{n}` used as a value")
            return
        if n in self.facts.imported_objects:
            if not (n in self.facts.used_by_region or n in self.all_jit or n.isupper()):
                self.flag("reference", node, f"`{n}`")
            return
        if n in self.all_jit or n in self.facts.wrappers:
            return
        if n in self.facts.functions or n in self.facts.constants or n in self.facts.other_globals:
            if n in self.facts.used_by_region or n in self.facts.constants:
                return
            self.flag("reference", node, f"`{n}`")
            return
        if n in ALLOWED_BUILTINS:
            return
        if n.split(".")[0] in BANNED_MODULES:
            self.flag(BANNED_MODULES[n], node, f"`{n}`")
            return
        self.flag("unknown_name", node, f"`{n}`")

    # -- the walk
    def walk(self) -> None:
        # a decorator's arguments (triton.heuristics lambdas) run on the host with the launch's arguments:
        # they are host code, whatever the function they decorate
        jit, self.jit = self.jit, False
        for d in self.fn.decorator_list:
            self.visit(d)
        self.jit = jit
        self.visit(self.fn, top=True)

    def visit(self, node: ast.AST, top: bool = False) -> None:
        if not top and isinstance(node, ast.FunctionDef) and self.hit(node) and node.decorator_list:
            self.flag("module_state", node, f"decorator on nested function `{node.name}`")
        if not top and isinstance(node, (ast.Lambda, ast.FunctionDef)) and self.hit(node):
            # a default is evaluated once, when the function is made: a lambda in a decorator lives as long
            # as the module, so a mutable default (lambda args, seen=[]: ...) is state every call shares
            for d in node.args.defaults + [k for k in node.args.kw_defaults if k is not None]:
                if not _is_literal(d) or isinstance(d, (ast.List, ast.Dict, ast.Set)):
                    self.flag("module_state", d, f"default `{ast.unparse(d)[:40]}`: a default is made once and shared by every call")
        if self.hit(node) and not top:
            self.check_node(node)
        elif top:
            self.check_node(node, header_only=True)
        for field_name, value in ast.iter_fields(node):
            if top and field_name == "decorator_list":
                continue
            for child in (value if isinstance(value, list) else [value]):
                if isinstance(child, ast.AST):
                    self.visit(child)

    def check_node(self, node: ast.AST, header_only: bool = False) -> None:
        if header_only:
            return  # the function's own header is checked by check_editable_defs
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            self.flag("try_except", node, "try/except")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = ", ".join(a.name for a in node.names)
            mod = node.module if isinstance(node, ast.ImportFrom) else names
            root = (mod or "").split(".")[0]
            self.flag(BANNED_MODULES.get(root, "import"), node, f"import {mod}")
        elif isinstance(node, ast.ClassDef):
            self.flag("tensor_subclass", node, f"class {node.name}")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            self.flag("module_state", node, f"{type(node).__name__.lower()} {', '.join(node.names)}")
        elif isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith, ast.Yield, ast.YieldFrom)):
            self.flag("concurrency", node, type(node).__name__)
        elif isinstance(node, ast.With):
            for item in node.items:
                ch = dotted(item.context_expr.func) if isinstance(item.context_expr, ast.Call) else None
                ok = ch is not None and self.resolve(ch[0].split(".")[0]) == "torch" and ch[0].split(".")[1:] == ["cuda", "device"]
                if not ok:
                    self.flag("context_manager", node, f"with {ast.unparse(item.context_expr)[:60]}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                        self.flag("module_state", sub, f"assigns `{ast.unparse(sub)[:60]}`")
                    elif isinstance(sub, ast.Subscript) and isinstance(sub.ctx, (ast.Store, ast.Del)) and not self.jit:
                        self.flag("module_state" if self._root_is_global(sub) else "torch_compute" if not self._root_is_param(sub)
                                  else "mutates_input", sub, f"writes `{ast.unparse(sub)[:60]}`")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            self.flag("torch_compute", node, "the @ operator")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str) and self.holds_object(node.right):
            self.flag("introspection", node, f"`{ast.unparse(node)[:60]}`: a module-level object formatted as text")
        elif isinstance(node, ast.FormattedValue) and self.holds_object(node.value):
            self.flag("introspection", node, f"`{ast.unparse(node.value)[:60]}` in an f-string: a module-level object as text")
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            operands = [node.left] + list(node.comparators)
            if not any(isinstance(o, ast.Constant) and o.value in (None, True, False, ...) for o in operands):
                self.flag("identity", node, f"`{ast.unparse(node)[:60]}`")
        elif isinstance(node, ast.Attribute):
            self.check_attribute(node)
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                self.check_name(node)
        elif isinstance(node, ast.Call):
            self.check_call(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and not isinstance(self.parent.get(node), ast.Expr):
            # (a bare string statement, a docstring, does nothing: it may name anything)
            up = node.value.upper()
            if any(s in up for s in SNIFF_STRINGS) or node.value.split(":")[0].lower() in DEVICE_STRINGS:
                self.flag("environment", node, f"string {node.value[:40]!r}")

    def _mutates_shared(self, f: ast.Attribute, is_module_chain: bool) -> bool:
        """``f`` (``x.append``, ``x.setdefault``, ...) changes an object that outlives the call: an argument,
        a module-level object or an alias of one, or an object inside a module (not a module's own function,
        ``tl.sort``, which only a resolver can tell apart)."""
        if is_module_chain:
            ch = dotted(f.value)
            if ch is None or self.resolver is None:
                return False
            first, _, rest = ch[0].partition(".")
            base = self.resolve(first)
            return base is not None and self.resolver(f"{base}.{rest}" if rest else base) is None
        return self._root_is_global(f.value) or self._outlives_call(f.value, self.aliased)

    @staticmethod
    def _plain_template(node: ast.AST) -> bool:
        """A literal ``str.format`` template whose fields name no attribute or item (``{0.device.type}``
        is ``getattr`` in disguise)."""
        import string

        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            return False
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(node.value) if f is not None]
        except ValueError:
            return False
        return not any("." in f or "[" in f for f in fields)

    def _root(self, node: ast.AST) -> ast.AST:
        cur = node
        while isinstance(cur, (ast.Attribute, ast.Subscript, ast.Call)):
            cur = cur.func if isinstance(cur, ast.Call) else cur.value
        return cur

    def _root_is_global(self, node: ast.AST) -> bool:
        r = self._root(node)
        return isinstance(r, ast.Name) and r.id not in self.local

    def _root_is_param(self, node: ast.AST) -> bool:
        r = self._root(node)
        return isinstance(r, ast.Name) and r.id in self.params

    def check_attribute(self, node: ast.Attribute) -> None:
        a = node.attr
        if a.startswith("__") and a.endswith("__"):
            self.flag("introspection", node, f"`.{a}`")
            return
        if a in FRAME_ATTRS:
            self.flag("introspection", node, f"`.{a}`")
            return
        if a in DEVICE_SNIFF_ATTRS or (isinstance(node.value, ast.Attribute) and node.value.attr == "device"):
            self.flag("environment", node, f"`{ast.unparse(node)[:60]}`")
            return
        if a == "device" and isinstance(node.ctx, ast.Load) and not self._device_use_ok(node):
            self.flag("environment", node, f"`{ast.unparse(self.parent.get(node, node))[:60]}`")
            return
        if "hook" in a.lower():
            self.flag("module_state", node, f"`.{a}`: hook registration (code run on every launch, shared by every call)")
            return
        base = node.value
        if isinstance(base, ast.Name) and self._global_object(base.id) and base.id not in self.facts.constants:
            self.flag("kernel_object", node, f"`{ast.unparse(node)[:60]}`")
            return
        if not self._is_module_chain(node) and self.holds_object(base):
            self.flag("kernel_object", node, f"`{ast.unparse(node)[:60]}` (through a local alias of a module-level object)")
            return
        if a.startswith("_") and not self._is_module_chain(node):
            self.flag("introspection", node, f"`.{a}` (private attribute, whatever the root)")
            return
        if not self.jit and not self._is_module_chain(node):
            if a in HOST_DATA_ATTRS:
                self.flag("host_data", node, f"`.{a}`")
                return
            p = self.parent.get(node)
            if a in COMPUTE_METHODS and not (isinstance(p, ast.Call) and p.func is node):
                self.flag("torch_compute", node, f"`.{a}` (a compute method taken as a value)")
                return
        if a in IDENTITY_ATTRS:
            self.flag("cache_by_identity", node, f"`.{a}`")
            return
        if a in FIXED_ATTRS:
            self.flag("reference", node, f"`.{a}`")
            return
        if self.jit and a in JIT_INTERNAL_ATTRS:
            self.flag("interpreter_internals", node, f"`.{a}`")
            return
        ch = dotted(node)
        if ch is not None and self.check_chain(ch[0], ch[1], node):
            return
        if a.startswith("_") and not isinstance(self._root(node), ast.Name):
            self.flag("introspection", node, f"`.{a}` (private attribute)")
        elif a.startswith("_") and isinstance(self._root(node), ast.Name) and self._root(node).id not in self.local:
            self.flag("introspection", node, f"`.{a}` (private attribute)")

    def _device_use_ok(self, node: ast.AST) -> bool:
        """A tensor's device (``x.device``, or a local bound to one) may be passed on (``device=...``,
        ``.to(...)``, ``torch.cuda.device(...)``), bound to a local (whose uses follow the same rule), or
        compared where a mismatch only raises (an ``assert``, an ``if`` whose body raises, a message).
        Anything else turns it into a value a branch can test: which device the call runs on, i.e. who is
        watching (``len(dev.type)``, ``probe.device == a.device`` with a CPU probe, ``str(...)``)."""
        p = self.parent.get(node)
        if isinstance(p, ast.keyword) and p.arg == "device":
            return True
        if isinstance(p, ast.Call) and node in p.args:
            ch = dotted(p.func)
            if isinstance(p.func, ast.Attribute) and p.func.attr == "to":
                return True
            if ch is not None and self.resolve(ch[0].split(".")[0]) == "torch" and ch[0].split(".")[1:] == ["cuda", "device"]:
                return True
        if isinstance(p, ast.Assign) and len(p.targets) == 1 and isinstance(p.targets[0], ast.Name) and p.value is node:
            return True
        cur, child = p, node
        while cur is not None and not isinstance(cur, ast.stmt):
            child, cur = cur, self.parent.get(cur)
        if isinstance(cur, (ast.Raise, ast.Assert)):
            return True
        if isinstance(cur, ast.If) and child is cur.test and not cur.orelse and all(isinstance(b, ast.Raise) for b in cur.body):
            return True
        return False

    def check_call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name) and f.id in TEXT_BUILTINS and f.id not in self.local \
                and any(self.holds_object(a) for a in list(node.args) + [k.value for k in node.keywords]):
            self.flag("introspection", node, f"`{ast.unparse(node)[:60]}`: a module-level object turned into text")
        if isinstance(f, ast.Attribute) and f.attr in ("format", "format_map", "join") \
                and any(self.holds_object(a) for a in list(node.args) + [k.value for k in node.keywords]):
            self.flag("introspection", node, f"`{ast.unparse(node)[:60]}`: a module-level object turned into text")
        if isinstance(f, ast.Attribute):
            method = f.attr
            ch = dotted(f)
            root_name = ch[0].split(".")[0] if ch is not None else ""
            is_module_chain = ch is not None and root_name in self.facts.aliases and root_name not in self.local
            if not self.jit and not is_module_chain:
                if method in COMPUTE_METHODS:
                    self.flag("torch_compute", node, f"`.{method}(...)`")
                elif method.endswith("_") and not method.endswith("__") and self._root_is_param(f.value):
                    self.flag("mutates_input", node, f"`{ast.unparse(f)[:60]}(...)`")
            if method in MUTATORS and self._mutates_shared(f, is_module_chain):
                root = self._root(f.value)
                rule = "mutates_input" if isinstance(root, ast.Name) and root.id in self.params else "module_state"
                self.flag(rule, node, f"`{ast.unparse(f)[:60]}(...)` on an object that outlives the call")
            if method in ("format", "format_map") and not self._plain_template(f.value):
                self.flag("dynamic_code", node, f"`{ast.unparse(f)[:60]}(...)`: a format template that reads attributes or items")
            if self.jit and ch is not None and not is_module_chain:
                root = ch[0].split(".")[0]
                if root not in self.local and root not in self.all_jit:
                    self.flag("jit_call", node, f"`{ch[0]}(...)`")
        elif isinstance(f, ast.Name) and self.jit:
            n = f.id
            if not (n in self.local or n in self.all_jit or n in JIT_BUILTINS):
                self.flag("jit_call", node, f"`{n}(...)`")
        elif isinstance(f, ast.Subscript):
            # kernel[grid](...) is a launch; anything else indexed and called is not kernel code
            base = f.value
            if not (isinstance(base, ast.Name) and base.id in self.all_jit):
                if not isinstance(base, ast.Name) or base.id not in self.local:
                    self.flag("dynamic_code", node, f"`{ast.unparse(f)[:60]}(...)`")


def _launches_jit(fn: ast.FunctionDef, jit: set[str]) -> bool:
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript) and isinstance(n.func.value, ast.Name) \
                and n.func.value.id in jit:
            return True
    return False


def _check_decorators(file: str, fn: ast.FunctionDef, changed: set[int], out: list[Finding]) -> None:
    for d in fn.decorator_list:
        if not any(n in changed for n in range(d.lineno, (d.end_lineno or d.lineno) + 1)):
            continue
        text = ast.unparse(d.func if isinstance(d, ast.Call) else d)
        if is_jit_decorator(d):
            if isinstance(d, ast.Call):
                bad = [k.arg for k in d.keywords if k.arg not in JIT_DECORATOR_KWARGS]
                if bad or d.args:
                    out.append(Finding(rule="decorator", file=file, line=d.lineno,
                                       message=f"@{text}({', '.join(str(b) for b in bad) or 'positional args'}): only "
                                               f"{', '.join(sorted(JIT_DECORATOR_KWARGS))} may be passed to triton.jit"))
            continue
        if text.endswith("heuristics") and isinstance(d, ast.Call):
            continue
        out.append(Finding(rule="decorator", file=file, line=d.lineno,
                           message=f"@{text}: {RULES['decorator']} (autotuning or wrapping changes what is measured)"))


def static_findings(file: str, old_source: str, new_source: str, added: set[int], wrappers: tuple[str, ...],
                    other_jit: set[str] = frozenset(), resolver: Callable[[str], str | None] | None = None) -> list[Finding]:
    """Every static-policy finding of one patched file. ``added``: new-side line numbers the patch adds
    or changes; ``wrappers``: the launch wrappers the file holds (empty for a helper file);
    ``other_jit``: jit function names of the family's other files (helpers the kernels may call);
    ``resolver``: the module a dotted name under torch/triton/math really is (None when it is no module)."""
    out: list[Finding] = []
    try:
        new_tree = parse_source(new_source)
    except SyntaxError as exc:
        return [Finding(rule="syntax", file=file, line=exc.lineno, message=f"does not parse: {exc.msg}")]
    old_tree = parse_source(old_source)
    facts = file_facts(new_source, wrappers, set(other_jit))
    facts.used_by_region = region_usage(old_source, wrappers)
    all_jit = set(facts.jit) | set(other_jit)
    old_defs = {n.name: n for n in old_tree.body if isinstance(n, ast.FunctionDef)}
    new_defs = {n.name: n for n in new_tree.body if isinstance(n, ast.FunctionDef)}
    # the kernels stay jit, the entry points keep their signature, decorators and launch
    for name, od in old_defs.items():
        if is_jit_def(od) and not (name in new_defs and is_jit_def(new_defs[name])):
            out.append(Finding(rule="kernel_not_jit", file=file, line=new_defs[name].lineno if name in new_defs else od.lineno,
                               message=f"`{name}` was @triton.jit and is {'not any more' if name in new_defs else 'gone'}: "
                                       f"{RULES['kernel_not_jit']}"))
    for name in wrappers:
        od, nd = old_defs.get(name), new_defs.get(name)
        if od is None:
            continue
        if nd is None:
            out.append(Finding(rule="entry_signature", file=file, line=od.lineno, message=f"the entry point `{name}` is gone"))
            continue
        if ast.dump(od.args) != ast.dump(nd.args) or ast.dump(od.returns or ast.Constant(None)) != ast.dump(nd.returns or ast.Constant(None)):
            out.append(Finding(rule="entry_signature", file=file, line=nd.lineno,
                               message=f"`{name}`'s signature changed: {RULES['entry_signature']} (it is fixed: run() calls it)"))
        if [ast.dump(d) for d in od.decorator_list] != [ast.dump(d) for d in nd.decorator_list]:
            out.append(Finding(rule="entry_signature", file=file, line=nd.lineno,
                               message=f"`{name}`'s decorators changed: {RULES['entry_signature']}"))
        if _launches_jit(od, set(facts.jit) | set(other_jit)) and not _launches_jit(nd, all_jit):
            out.append(Finding(rule="no_launch", file=file, line=nd.lineno,
                               message=f"`{name}` no longer launches a @triton.jit kernel (kernel[grid](...)): {RULES['no_launch']}"))
    for node in new_tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        jit = is_jit_def(node)
        if not (jit or node.name in wrappers):
            continue
        span = range(min([d.lineno for d in node.decorator_list] + [node.lineno]), (node.end_lineno or node.lineno) + 1)
        if not any(n in added for n in span):
            continue
        if jit:
            _check_decorators(file, node, added, out)
        _Walker(file, facts, node, added, jit, all_jit, out, resolver).walk()
        for line, code in launch_value_uses(node, added):
            out.append(Finding(rule="launch_value", file=file, line=line, message=f"`{code}`: {RULES['launch_value']}"))
    return out


def static_gate(es_wrappers: dict[str, tuple[str, ...]], patch_files: list[Any], old_texts: dict[str, str],
                new_texts: dict[str, str], resolver: Callable[[str], str | None] | None = None) -> list[Finding]:
    """``static_findings`` over every file of a patch (``patch_files``: ``FilePatch`` objects of the
    family's editable files). The jit functions of every editable file are known to each other."""
    all_jit: set[str] = set()
    for rel, text in new_texts.items():
        try:
            all_jit |= {r.name for r in regions_of(text, rel, ()) if r.kind == "jit"}
        except SyntaxError:
            pass
    for rel, text in old_texts.items():
        try:
            all_jit |= {r.name for r in regions_of(text, rel, ()) if r.kind == "jit"}
        except SyntaxError:
            pass
    out: list[Finding] = []
    for fp in patch_files:
        rel = fp.path
        if rel not in new_texts or rel not in old_texts:
            continue
        added = {n for h in fp.hunks for n, t in h.added_new_lines()}
        out += static_findings(rel, old_texts[rel], new_texts[rel], added, es_wrappers.get(rel, ()), all_jit, resolver)
    return out

