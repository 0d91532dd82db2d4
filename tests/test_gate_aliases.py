"""The static gate follows aliases (issue 30, item 4): the kernel-object and private-attribute rules hold
whatever the root of the chain, a module-level object is never turned into text, and hook registration is
refused on any path. Each rule is checked over mutations of the alias pattern (assignment chains, tuple
unpacking, getattr, walrus, default args, lambdas, comprehensions, containers), not one instance; the edits
a kernel engineer makes still pass. Pure AST work."""

from __future__ import annotations

import pytest
from test_gate_static import at_return, gemm_rules

# How a local name comes to hold the module-level kernel object (``kk`` afterwards).
ALIASES = {
    "assign": "    kk = gemm_kernel\n",
    "chain": "    k0 = gemm_kernel\n    k1 = k0\n    kk = k1\n",
    "multi_target": "    k0 = kk = gemm_kernel\n",
    "tuple_unpack": "    n0, kk = 1, gemm_kernel\n",
    "starred": "    n0, *rest = 1, gemm_kernel\n    kk = rest[0]\n",
    "walrus": "    if (kk := gemm_kernel) is None:\n        raise ValueError('x')\n",
    "for_loop": "    for kk in (gemm_kernel,):\n        pass\n",
    "comprehension": "    kk = [k for k in (gemm_kernel,)][0]\n",
    "dict_value": "    kk = {'k': gemm_kernel}['k']\n",
    "if_expr": "    kk = gemm_kernel if M > 0 else None\n",
    "lambda_call": "    kk = (lambda: gemm_kernel)()\n",
    "lambda_bound": "    get = lambda: gemm_kernel\n    kk = get()\n",
    "bool_op": "    kk = None or gemm_kernel\n",
    "helper_function": "    kk = grouped_pid\n",
}
# What the alias is then used for, and the rule each use must meet.
USES = {
    "private_chain": ("introspection", "kernel_object", "    x = kk._cache\n"),
    "deep_private": ("introspection", "kernel_object", "    x = kk.fn._something.mod\n"),
    "public_attr": ("kernel_object", None, "    x = kk.cache\n"),
    "str": ("introspection", None, "    x = str(kk)\n"),
    "repr": ("introspection", None, "    x = repr(kk)\n"),
    "fstring": ("introspection", None, "    x = f'{kk}'\n"),
    "percent": ("introspection", None, "    x = '%s' % (kk,)\n"),
    "format": ("introspection", None, "    x = '{}'.format(kk)\n"),
    "hook": ("module_state", "kernel_object", "    kk.add_pre_run_hook(None)\n"),
}


@pytest.mark.parametrize("use", sorted(USES))
@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_rules_follow_every_alias(alias, use):
    rule, alt, code = USES[use]
    rules = gemm_rules("    return c\n\n\nimport sys as _sys", at_return(ALIASES[alias] + code)[len("    )\n"):])
    assert rule in rules or (alt is not None and alt in rules), (alias, use, rules)


def test_default_args_bind():
    body = "    def probe(kk=gemm_kernel):\n        return kk._cache\n    x = probe()\n"
    assert {"introspection", "kernel_object"} & set(gemm_rules("    return c\n\n\nimport sys as _sys",
                                                             at_return(body)[len("    )\n"):]))
    body = "    probe = lambda kk=gemm_kernel: str(kk)\n    x = probe()\n"
    assert "introspection" in gemm_rules("    return c\n\n\nimport sys as _sys", at_return(body)[len("    )\n"):])


@pytest.mark.parametrize("code", [
    "    x = a._version\n",  # a private attribute of a parameter
    "    x = c.storage()._cdata\n",
    "    x = (a if M else b)._base\n",
    "    x = [a][0]._base\n",
])
def test_private_attributes_whatever_the_root(code):
    rules = gemm_rules("    return c\n\n\nimport sys as _sys", at_return(code)[len("    )\n"):])
    assert {"introspection", "cache_by_identity"} & set(rules), rules


@pytest.mark.parametrize("code", [
    "    triton.knobs.runtime.launch_enter_hook = None\n",
    "    h = triton.knobs\n",
    "    x = my_hook\n",
    "    a.register_hook(None)\n",
    "    c.register_post_accumulate_grad_hook(None)\n",
])
def test_hook_registration_refused_on_any_path(code):
    rules = gemm_rules("    return c\n\n\nimport sys as _sys", at_return(code)[len("    )\n"):])
    assert rules, code


@pytest.mark.parametrize("code", [
    "    x = str(M)\n",
    "    x = f'{M}x{N}'\n",
    "    x = '%d' % K\n",
    "    k = gemm_kernel\n    k[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), "
    "c.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1)\n",
])
def test_plain_wrapper_code_passes(code):
    assert gemm_rules("    return c\n\n\nimport sys as _sys", at_return(code)[len("    )\n"):]) == []
