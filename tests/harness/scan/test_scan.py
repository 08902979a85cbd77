"""harness.scan: the static scan of candidate sources (CPU) and the shared-object backstop (g++ builds here).

Each rejected construct is inserted into the RowScale base kernel at a known place; the line marked `// <-`
is the one the scan must name. The real SGLang 0.5.23 sources (downloaded once, `network`) must all pass when
every line counts as added."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.scan import elf_scan, source_text
from harness.scan.elf_scan import elf_tools_available, scan_shared_object
from harness.scan.source_scan import scan_candidate

BASE = (Path(__file__).resolve().parents[2] / "adversarial" / "kernels" / "base" / "rowscale.cuh").read_text()
ANCHORS = {
    "top": "#include <cstdint>",  # after the includes
    "ns": "constexpr int kThreads = 256;",  # namespace scope, inside `namespace rowscale`
    "host": "    if (rows == 0 || cols == 0) return;",  # inside RowScaleKernel::run (host code)
    "device": "    const float value = DType<T>::load(x[row * cols + c]) * DType<T>::load(w[c]);",  # kernel body
}


def inject(snippet: str, where: str) -> tuple[str, int | None]:
    """The base with `snippet` after the anchor line, and the 1-based line of the snippet's `// <-` mark."""
    lines = BASE.split("\n")
    anchor = lines.index(ANCHORS[where])
    added = snippet.strip("\n").split("\n")
    marked = [k for k, line in enumerate(added) if line.rstrip().endswith("// <-")]
    return "\n".join(lines[:anchor + 1] + added + lines[anchor + 1:]), (anchor + 2 + marked[0] if marked else None)


REJECTED = [
    # static constructors / destructors / load-time sections
    ("ns", "__attribute__((constructor)) static void boot() {}  // <-", "constructor"),
    ("ns", "__attribute__((destructor)) static void bye() {}  // <-", "constructor/destructor"),
    ("ns", "[[gnu::constructor]] static void boot() {}  // <-", "constructor"),
    ("ns", "static void boot() {}\n"
           "static void (*boot_ptr)() __attribute__((section(\".init_array\"))) = &boot;  // <-", "section"),
    ("ns", "__attribute__((used, section(\".init_array\"))) static void* ptr = nullptr;  // <-", "section"),
    ("ns", "asm(\".pushsection .init_array\\n.quad 0\\n.popsection\");  // <-", "init_array"),
    ("host", "    std::atexit([] {});  // <-", "atexit"),
    # namespace-scope objects initialized by a call or a lambda at load time
    ("ns", "inline int compute() { return 3; }\nstatic int initialized = compute();  // <-", "namespace-scope"),
    ("ns", "static const bool registered = [] {  // <-\n  return true;\n}();", "namespace-scope"),
    ("ns", "inline const int random_value = std::rand();  // <-", "namespace-scope"),
    ("top", "struct Registrar { explicit Registrar(int) {} };\n"
            "inline int make_id() { return 1; }\nRegistrar registrar(make_id());  // <-", "namespace-scope"),
    ("top", "struct Registrar { int id; };\nRegistrar registrar{[] { return 1; }()};  // <-", "namespace-scope"),
    # the Python C API
    ("host", "    PyRun_SimpleString(\"print(1)\");  // <-", "Python C API"),
    ("ns", "extern \"C\" int PyRun_SimpleString(const char*);  // <-", "Python C API"),
    ("host", "    Py_Initialize();  // <-", "Python C API"),
    ("host", "    auto fn = &PyGILState_Ensure;  // <-", "Python C API"),
    ("top", "#include <Python.h>  // <-", "Python.h"),
    ("top", "#include <pybind11/pybind11.h>  // <-", "pybind11"),
    # dynamic loading
    ("host", "    void* lib = dlopen(\"libc.so.6\", 2);  // <-", "dynamic loading"),
    ("host", "    void* fn = dlsym(nullptr, \"system\");  // <-", "dlsym"),
    ("host", "    void* fn = dlsym(RTLD_DEFAULT,  // <-\n                     \"getenv\");", "dlsym"),
    ("host", "    void* lib = dlmopen(0, \"x\", 2);  // <-", "dynamic loading"),
    ("host", "    void* fn = dlvsym(nullptr, \"x\", \"v\");  // <-", "dynamic loading"),
    # process creation
    ("host", "    system(\"ls\");  // <-", "process creation"),
    ("host", "    (void)std::system(\"ls\");  // <-", "process creation"),
    ("host", "    auto* pipe = popen(\"ls\", \"r\");  // <-", "process creation"),
    ("host", "    if (fork() == 0) return;  // <-", "process creation"),
    ("host", "    vfork();  // <-", "process creation"),
    ("host", "    execve(\"/bin/sh\", nullptr, nullptr);  // <-", "process creation"),
    ("host", "    execvp(\"sh\", nullptr);  // <-", "process creation"),
    ("host", "    execl(\"/bin/sh\", \"sh\", nullptr);  // <-", "process creation"),
    ("host", "    posix_spawn(nullptr, \"/bin/sh\", nullptr, nullptr, nullptr, nullptr);  // <-", "process creation"),
    ("host", "    clone(nullptr, nullptr, 0, nullptr);  // <-", "process creation"),
    # files and sockets
    ("host", "    auto* f = fopen(\"/tmp/x\", \"w\");  // <-", "file"),
    ("host", "    auto* f = std::freopen(\"/tmp/x\", \"w\", stdout);  // <-", "file"),
    ("host", "    int fd = open(\"/etc/passwd\", 0);  // <-", "file"),
    ("host", "    int fd = ::openat(0, \"x\", 0);  // <-", "file"),
    ("host", "    creat(\"/tmp/x\", 0644);  // <-", "file"),
    ("host", "    std::ifstream in(\"/etc/passwd\");  // <-", "file"),
    ("host", "    std::ofstream out_file(\"/tmp/x\");  // <-", "file"),
    ("host", "    std::fstream both(\"/tmp/x\");  // <-", "file"),
    ("host", "    FILE* f = nullptr;  // <-", "file"),
    ("host", "    unlink(\"/tmp/x\");  // <-", "file"),
    ("host", "    std::remove(\"/tmp/x\");  // <-", "remove"),
    ("host", "    rename(\"/tmp/x\", \"/tmp/y\");  // <-", "file"),
    ("host", "    mkdir(\"/tmp/x\", 0700);  // <-", "file"),
    ("host", "    int s = socket(2, 1, 0);  // <-", "socket"),
    ("host", "    connect(s, nullptr, 0);  // <-", "socket"),
    ("host", "    ::bind(s, nullptr, 0);  // <-", "bind"),
    ("host", "    sendto(s, nullptr, 0, 0, nullptr, 0);  // <-", "socket"),
    ("host", "    recvfrom(s, nullptr, 0, 0, nullptr, nullptr);  // <-", "socket"),
    # the environment
    ("host", "    const char* home = getenv(\"HOME\");  // <-", "getenv"),
    # run-time loading of GPU code: a kernel loaded so has no name ptxas reported (racecheck's watch list)
    ("host", "    CUmodule m;\n    cuModuleLoadData(&m, kPtx);  // <-", "run-time loading of GPU code"),
    ("host", "    cudaLibrary_t lib;\n    cudaLibraryLoadData(&lib, kCubin, 0, 0, 0, 0, 0, 0);  // <-",
     "run-time loading of GPU code"),
    ("host", "    nvrtcCompileProgram(program, 0, nullptr);  // <-", "run-time loading of GPU code"),
    ("host", "    cuLinkCreate(0, nullptr, nullptr, &state);  // <-", "run-time loading of GPU code"),
    ("host", "    void* fn = dlsym(RTLD_DEFAULT, \"cuModuleLoadData\");  // <-", "run-time loading of GPU code"),
    ("host", "    cudaGetDriverEntryPoint(\"cuLibraryLoadData\", &fn, cudaEnableDefault);  // <-",
     "run-time loading of GPU code"),
    ("host", "    cuGetProcAddress(name, &fn, 12000, 0, nullptr);  // <-", "not a literal"),
    ("host", "    const char* key = std::getenv(\"OPENAI_API_KEY\");  // <-", "getenv"),
    ("host", "    const char* key = secure_getenv(\"X\");  // <-", "environment"),
    ("host", "    char** env = environ;  // <-", "environment"),
    ("host", "    setenv(\"X\", \"1\", 1);  // <-", "environment"),
    ("host", "    putenv(nullptr);  // <-", "environment"),
    # raw syscalls and host assembly
    ("host", "    syscall(39);  // <-", "syscall"),
    ("host", "    asm volatile(\"syscall\" ::: \"rcx\", \"r11\");  // <-", "assembly"),
    ("host", "    __asm__ __volatile__(\"int $0x80\");  // <-", "assembly"),
    ("host", "    long r;\n    asm(\"movq %%rax, %0\" : \"=r\"(r));  // <-", "assembly"),
    ("host", "    asm volatile(  // <-\n        \"mov $60, %%eax\\n\"\n        \"syscall\\n\" ::: \"memory\");", "assembly"),
    ("host", "    asm volatile(\"call system\");  // <-", "assembly"),
    # headers
    ("top", "#include <dlfcn.h>\n#include <unistd.h>  // <-", "unistd.h"),
    ("top", "#include <fcntl.h>  // <-", "fcntl.h"),
    ("top", "#include <sys/socket.h>  // <-", "sys/socket.h"),
    ("top", "#include <sys/mman.h>  // <-", "sys/mman.h"),
    ("top", "#include <fstream>  // <-", "fstream"),
    ("top", "#include <filesystem>  // <-", "filesystem"),
    ("top", "#include <spawn.h>  // <-", "spawn.h"),
    ("top", "#include \"/etc/passwd\"  // <-", "outside the kernel tree"),
    ("top", "#include \"../../../../../etc/passwd\"  // <-", "outside the kernel tree"),
    ("top", "#include <somelib/whatever.h>  // <-", "allow-list"),
    ("top", "#include \"unistd.h\"  // <-", "unistd.h"),
    ("top", "#embed \"/etc/passwd\"  // <-", "#embed"),
    # backslash tricks the lexer would otherwise hide
    ("host", "    sys\\\ntem(\"ls\");", None),
    ("host", "    sys\\u0074em(\"ls\");  // <-", "universal character name"),
]


@pytest.mark.parametrize(("where", "snippet", "what"), REJECTED, ids=[f"{i}-{r[2]}" for i, r in enumerate(REJECTED)])
def test_rejected_construct_is_named_with_its_line(where, snippet, what):
    candidate, line = inject(snippet, where)
    reason = scan_candidate(BASE, candidate)
    assert reason is not None, snippet
    if line is None:  # the splice: the line that ends with the backslash
        line = candidate.split("\n").index("    sys\\") + 1
    assert reason.startswith(f"line {line}: "), (reason, line)
    assert reason.endswith("is not allowed in a kernel file") and "\n" not in reason
    if what:
        assert what.lower() in reason.lower(), reason


ACCEPTED = [
    ("ns", "constexpr int kBlock = 256;"),
    ("ns", "constexpr int kBig = 1'000'000;\nconstexpr char kQuote = '\"';\nconstexpr char kTick = '\\'';"),
    ("ns", "using Index = int64_t;"),
    ("ns", "template <typename U, int N = 4>\n__device__ U twice(U v) {\n  return v + v;\n}"),
    ("ns", "inline int helper(int a, int b = 2) {\n  return a + b;\n}"),
    ("ns", "static const int kProduct = 4 * 8;"),
    ("ns", "const float kEps = static_cast<float>(1e-6);"),
    ("ns", "static const unsigned kMask = sizeof(int) * 8 - 1;"),
    ("ns", "int table[] = {1, 2, 3};"),
    ("ns", "static_assert(sizeof(int) == 4, \"int\");"),
    ("ns", "void declared(int a, const char* b);"),
    ("ns", "__device__ __forceinline__ float scale_value(float v) { return v * 2.0f; }"),
    ("ns", "enum class Mode { A = 1, B };"),
    ("ns", "struct Params {\n  int a = 1;\n  int b = helper_default();\n  static int helper_default() { return 2; }\n};"),
    ("ns", "constexpr auto kLambda = [](int v) { return v * 2; };"),
    ("ns", "const char* kMessage = \"call fork() and popen(), read getenv\";"),
    ("top", "#include <cstdlib>\n#include <cstdio>\n#include <cuda_fp16.h>\n#include <cub/cub.cuh>\n"
            "#include <sgl_kernel/utils.cuh>\n#include \"marlin.cuh\"\n#include <type_traits>\n#include <dlfcn.h>"),
    ("host", "    // std::system(\"ls\"); popen(); fork(); getenv(\"HOME\");"),
    ("host", "    /* dlopen(\"x\")\n       fopen(\"/tmp/x\", \"w\") */"),
    ("host", "    TVM_FFI_CHECK(rows > 0, ValueError) << \"system(popen) getenv\";"),
    ("host", "    const char* debug = std::getenv(\"SGLANG_DEBUG_ROWSCALE\");"),
    ("host", "    void* fn = dlsym(RTLD_DEFAULT, \"cudaMemcpyBatchAsync\");"),
    ("host", "    void* fn = dlsym(RTLD_DEFAULT,\n                     \"cuTensorMapEncodeTiled\");"),
    ("host", "    cudaGetDriverEntryPointByVersion(\n        \"cuTensorMapEncodeTiled\", &fn, 12000, cudaEnableDefault, "
             "&status);"),
    ("host", "    static const char* kPy = R\"PY(\nimport os\nos.system(\"ls\")\n)PY\";"),
    ("host", "    std::vector<int> v;\n    v.erase(std::remove(v.begin(), v.end(), 0), v.end());"),
    ("host", "    auto bound = std::bind(check_cuda, cudaSuccess, \"x\");"),
    ("host", "    auto copy = x.clone();\n    copy.open(3);"),
    ("device", "    asm volatile(\"\" ::: \"memory\");"),
    ("device", "    asm volatile(\"prefetch.global.L2 [%0];\" ::\"l\"(x));"),
    ("device", "    uint32_t a, b, c, d;\n    asm volatile(\"ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\"\n"
               "                 : \"=r\"(a), \"=r\"(b), \"=r\"(c), \"=r\"(d) : \"l\"(x));"),
    ("device", "    asm volatile(\"red.global.add.f32 [%0], %1;\" ::\"l\"(out), \"f\"(1.0f));"),
    ("device", "    asm volatile(\n        \"{\\n\"\n        \".reg .pred p;\\n\"\n        \"setp.ne.b32 p, %0, 0;\\n\"\n"
               "        \"}\\n\" ::\"r\"(1));"),
]


@pytest.mark.parametrize(("where", "snippet"), ACCEPTED, ids=[str(i) for i in range(len(ACCEPTED))])
def test_accepted_construct_passes(where, snippet):
    candidate, _ = inject(snippet, where)
    assert scan_candidate(BASE, candidate) is None


def test_nothing_is_flagged_when_the_candidate_is_the_original():
    assert scan_candidate(BASE, BASE) is None
    assert scan_candidate("", "") is None


def test_constructs_already_in_the_original_are_not_the_candidates_doing():
    original, _ = inject("    (void)std::system(\"ls\");", "host")
    assert scan_candidate(original, original) is None
    edited = original.replace("accumulated in float32", "accumulated in fp32").replace("kThreads = 256", "kThreads = 128")
    assert scan_candidate(original, edited) is None
    assert scan_candidate(BASE, original) is not None


def test_only_a_comment_change_adds_nothing():
    candidate = BASE.replace("// RowScale:", "// RowScale (faster):") + "\n// popen(\"x\")\n"
    assert scan_candidate(BASE, candidate) is None


def test_uncommenting_original_code_counts_as_adding_it():
    original, _ = inject("    // (void)std::system(\"ls\");", "host")
    candidate, line = inject("    (void)std::system(\"ls\");  // <-", "host")
    assert scan_candidate(original, candidate).startswith(f"line {line}: process creation")


def test_enabling_an_if0_block_counts_as_adding_it():
    original, _ = inject("#if 0\n    (void)std::system(\"ls\");\n#endif", "host")
    candidate = original.replace("#if 0", "#if 1")
    line = candidate.split("\n").index("    (void)std::system(\"ls\");") + 1
    assert scan_candidate(original, candidate) == f"line {line}: process creation is not allowed in a kernel file"


def test_the_first_offending_line_is_reported():
    candidate, _ = inject("    int fd = open(\"x\", 0);  // <-\n    (void)std::system(\"ls\");", "host")
    line = candidate.split("\n").index("    int fd = open(\"x\", 0);  // <-") + 1
    assert scan_candidate(BASE, candidate).startswith(f"line {line}: file or socket access")


def test_clean_source_keeps_lines_and_columns():
    text = 'int a; // x\n/* multi\nline */ int b = "s\\"t";\nchar c = \'"\';\nauto r = R"d(\n")d";\n'
    code, strs = source_text.clean_source(text)
    assert len(code) == len(strs) == text.count("\n") + 1
    assert all(len(c) == len(s) for c, s in zip(code, strs))
    assert code[0].rstrip() == "int a;" and not code[1].strip()
    assert code[2] == '        int b = "    ";' and strs[2] == '        int b = "s\\"t";'
    assert code[3] == "char c = ' ';" and strs[3] == "char c = '\"';"
    assert code[4] == 'auto r = R"  ' and code[5] == '   ";' and strs[5] == '")d";'


@pytest.mark.network
def test_real_sglang_sources_pass_with_every_line_added(sglang_0523):
    files = sorted(p for p in Path(sglang_0523.csrc_dir).rglob("*") if p.suffix in (".cuh", ".cu"))
    assert len(files) > 150, len(files)
    flagged = {str(p.relative_to(sglang_0523.csrc_dir)): scan_candidate("", p.read_text(errors="replace"))
               for p in files}
    flagged = {name: reason for name, reason in flagged.items() if reason}
    print(f"scanned {len(files)} SGLang 0.5.23 csrc files, {len(flagged)} flagged")
    assert not flagged, flagged


# --------------------------------------------------------------------------------------------------------------
# The shared-object backstop.
# --------------------------------------------------------------------------------------------------------------

CLEAN = "extern \"C\" int kernel_entry(int a) { return a + 1; }\n"
LIBRARIES = {
    "clean": CLEAN,
    "dlsym": "#include <dlfcn.h>\n" + CLEAN + "extern \"C\" void* lookup(const char* n) { return dlsym(RTLD_DEFAULT, n); }\n",
    "ctor": CLEAN + "static volatile int booted;\n__attribute__((constructor)) static void boot() { booted = 1; }\n",
    "getenv": "#include <cstdlib>\n" + CLEAN + "extern \"C\" const char* key() { return std::getenv(\"K\"); }\n",
    "harmless": "#include <cstring>\n" + CLEAN + "extern \"C\" unsigned long len(const char* s) { return strlen(s); }\n",
}


@pytest.fixture(scope="module")
def libraries(tmp_path_factory) -> dict[str, str]:
    compiler = shutil.which("g++")
    if compiler is None or not elf_tools_available():
        pytest.skip("needs g++ and binutils")
    out = tmp_path_factory.mktemp("so")
    paths = {}
    for name, source in LIBRARIES.items():
        (out / f"{name}.cpp").write_text(source)
        so = out / f"lib{name}.so"
        subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(so), str(out / f"{name}.cpp")], check=True)
        paths[name] = str(so)
    return paths


def test_shared_object_backstop(libraries):
    clean = libraries["clean"]
    assert scan_shared_object(clean, clean) is None
    assert scan_shared_object(clean, libraries["harmless"]) is None
    reason = scan_shared_object(clean, libraries["dlsym"])
    assert reason and "dlsym" in reason and "\n" not in reason
    assert "getenv" in scan_shared_object(clean, libraries["getenv"])
    reason = scan_shared_object(clean, libraries["ctor"])
    assert reason and ".init_array" in reason and re.search(r"grew from \d+ to \d+ bytes", reason)
    assert scan_shared_object(libraries["dlsym"], libraries["dlsym"]) is None  # already in the original


def test_shared_object_helpers_read_imports_with_either_tool(libraries, monkeypatch):
    with_nm = elf_scan.undefined_symbols(libraries["dlsym"])
    assert "dlsym" in with_nm
    real_which = shutil.which
    monkeypatch.setattr(elf_scan.shutil, "which", lambda tool: None if tool == "nm" else real_which(tool))
    assert elf_scan.undefined_symbols(libraries["dlsym"]) == with_nm  # readelf --dyn-syms
    ctor, clean = elf_scan.init_sizes(libraries["ctor"]), elf_scan.init_sizes(libraries["clean"])
    assert ctor[".init_array"] > clean[".init_array"]


def test_without_elf_tools_the_backstop_is_silent_and_says_so(libraries, monkeypatch):
    monkeypatch.setattr(elf_scan.shutil, "which", lambda tool: None)
    assert elf_tools_available() is False
    assert scan_shared_object(libraries["clean"], libraries["dlsym"]) is None
