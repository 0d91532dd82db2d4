"""The CUDA rules' tokenizer and rules on hand-written preprocessed text (no nvcc): line markers, string
literals joined and unescaped, timers and special registers however spelled, calls, includes named not
quoted, directives read as the preprocessor reads them, and the outside-the-region comparison."""

from __future__ import annotations

import pytest

from kernels.cuda import tokens

FAM = "/src/fam/k.cu"


def _own(f: str) -> str | None:
    return "k.cu" if f == FAM else None


def _pp(body: str, header: str = "int h;\n") -> str:
    return (f'# 1 "/tmp/w/unit.cu"\n# 1 "<built-in>"\n# 1 "/usr/local/cuda/include/cuda_runtime.h" 1\n{header}'
            f'# 2 "/tmp/w/unit.cu" 2\n# 1 "{FAM}" 1\n{body}# 3 "/tmp/w/unit.cu" 2\nvoid* e = &k;\n')


def test_tokens_carry_the_markers_file_and_line():
    toks = tokens.tokenize(_pp("int a;\n\nint b <: 2 :>;\n"))
    b = [t for t in toks if t.text == "b"][0]
    assert (b.file, b.line) == (FAM, 3)
    assert [t.text for t in toks if t.file == FAM][-4:] == ["[", "2", "]", ";"]  # digraphs spelled canonically
    h = [t for t in tokens.tokenize(_pp("int a;\n"), lambda f: f == FAM) if t.kind == "hdr"]
    assert len(h) >= 1 and h[0].file.endswith("cuda_runtime.h")  # headers are one digest token


def test_literals_are_joined_and_unescaped():
    assert tokens.literal_value(r'"a\x25;\045c\n"') == "a%;%c\n"
    assert tokens.literal_value('u8R"x(%%glob)x"') == "%%glob"
    toks = tokens.tokenize('"mov %%glo" "baltimer;" L"x"\n')
    assert tokens.joined_strings(toks)[0][1] == "mov %%globaltimer;x"


@pytest.mark.parametrize("body,rule,word", [
    ('asm volatile("mov.u64 %0, %%glo" "baltimer;" : "=l"(t));\n', "special_register", "globaltimer"),
    ('asm("mov.u32 %0, \\x25nsmid;" : "=r"(n));\n', "special_register", "nsmid"),
    ('__asm__ __volatile__("mov.u32 %0, %%laneid;" : "=r"(n));\n', "special_register", "laneid"),
    ("long long t = clock64();\n", "timer", "clock64"),
    ("long t = __clock_internal();\n", "timer", "__clock_internal"),
    ("unsigned s = cuda::ptx::get_sreg_smid();\n", "timer", "get_sreg_smid"),
    ('const char* s = "%globaltimer";\n', "special_register", "globaltimer"),
    ('if (getenv("X")) return;\n', "environment", "getenv"),
    ('void* h = dlopen("x", 1);\n', "dynamic_loading", "dlopen"),
    ('FILE* f = fopen("/etc/passwd", "r");\n', "host_io", "fopen"),
    ('system("id");\n', "process", "system"),
    ("syscall(39);\n", "syscall", "syscall"),
])
def test_rules_catch_however_written(body, rule, word):
    found = tokens.token_findings(tokens.tokenize(_pp(body)), _own)
    assert any(r == rule and word in m for r, _f, _n, m in found), found


def test_rules_leave_honest_code_alone():
    body = ('asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n" :: "r"(d), "l"(g), "r"(n));\n'
            'printf("%d\\n", x); int open_slabs = 3; float time_left = 1.0f; int system_count = 2;\n')
    assert tokens.token_findings(tokens.tokenize(_pp(body)), _own) == []
    # the header's own clock64 declaration is not the family's
    assert tokens.token_findings(tokens.tokenize(_pp("int a;\n", header="long long clock64();\n")), _own) == []


def test_includes_outside_are_named():
    text = _pp("int a;\n") + '# 1 "/etc/hostname" 1\nsecret_host\n# 7 "/src/fam/k.cu" 2\n'
    assert tokens.include_sites(text)["/etc/hostname"] == (FAM, 6)
    found = tokens.include_findings(tokens.marker_files(text), [tokens.Path("/usr/local/cuda")], [tokens.Path("/src/fam")],
                                    {"/tmp/w/unit.cu"})
    assert len(found) == 1 and "/etc/hostname" in found[0][3] and "secret_host" not in found[0][3]


@pytest.mark.parametrize("src", ['#line 3 "k.cu"\n', '#/**/line 3\n', '%:line 3\n', '# 12 "x.cu"\n', '#\\\nline 4\n',
                                 '  /* c */ # /* d */ line 9\n'])
def test_line_directives_however_written(src):
    found = tokens.directive_findings("int a;\n" + src, "k.cu")
    assert found and found[0][2] == 2, found


def test_directives_ignore_comments_and_strings():
    src = '// #line 3\nconst char* s = "#line 4";\n/*\n#line 5\n*/\n#pragma unroll\n'
    assert tokens.directive_findings(src, "k.cu") == []
    assert (6, "pragma") in tokens.directive_lines(src)


def test_outside_tokens_must_match_the_baseline():
    base = tokens.tokenize(_pp("int helper() { return 1; }\nvoid kern() { int x = 2; }\n"))
    same = tokens.tokenize(_pp("int helper() { return 1; }\nvoid kern() { int y = 3; }\n"))
    moved = tokens.tokenize(_pp("int helper() { return 2; }\nvoid kern() { int x = 2; }\n"))
    regions = {"k.cu": [(2, 2)]}

    def cmp(new):
        return tokens.outside_findings(tokens.outside_stream(base, _own, regions), tokens.outside_stream(new, _own, regions),
                                       _own, _own)

    assert cmp(same) == []
    (found,) = cmp(moved)
    assert found[0] == "outside_region" and found[2] == 1 and "helper" in found[3]


def test_raw_string_holding_a_marker_is_refused():
    text = _pp('const char* s = R"x(\n') + '# 1 "/usr/include/x.h"\n)x"; long t = clock64();\n'
    with pytest.raises(tokens.RelabelError):
        tokens.tokenize(text, lambda f: f == FAM)
