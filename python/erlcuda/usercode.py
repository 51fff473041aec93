"""User CUDA code: a user's source checked and compiled through the one compile cache
(``compile.py``), for a GPU (``compile_module``: a cubin) or for the host (``compile_host``:
the cpu backend's shared library, see ``hostcode``), and elementwise kernels written from a
one-statement operation.

A cubin needs nvcc, not PyCUDA or a GPU, so a source can be checked anywhere the toolkit
is; a host build needs g++ alone. Errors: ``CompileError`` (the compiler refused the source;
``.log`` is its message), ``NoCompiler`` (no nvcc, or no g++ for a host build),
``Unsupported`` (a host build of a source that uses what the cpu backend cannot run),
``ValueError`` (a bad name, type or architecture, before a compiler runs), of which
``BadOption`` is an nvcc option outside ``ALLOWED_OPTIONS``.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Callable, Sequence

from . import elements, hostcode
from .compile import (
    SOURCE_NAME,
    Compiled,
    CompileError,
    NoCompiler,
    arch_of,
    cache_dir,
    cubin_entry,
    default_arch,
    find_nvcc,
    host_library_entry,
)
from .hostcode import Unsupported

__all__ = [
    "ALLOWED_OPTIONS",
    "C_TYPES",
    "BadOption",
    "CompileError",
    "Compiled",
    "NoCompiler",
    "Unsupported",
    "arch_of",
    "cache_dir",
    "compile_entry",
    "compile_host",
    "compile_host_entry",
    "compile_module",
    "default_arch",
    "elementwise_source",
    "find_nvcc",
]

#: C type of each element type.
C_TYPES = elements.C_TYPES

#: The longest kernel name: the launch frame's name field is one length byte.
MAX_NAME = elements.KERNEL_NAME_BYTES

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A macro's value: nvcc hands -D to the host compiler through a shell, so the value keeps to
#: characters that no shell treats specially (and no comma, where nvcc splits a list).
_MACRO = r"[A-Za-z_][A-Za-z0-9_]*(?:=[A-Za-z0-9_.+-]*)?"
#: The nvcc options a source may be compiled with, each one list element matched whole: what
#: changes the code nvcc makes, never where it writes, what it reads or runs, or for which
#: architecture (compile_module decides that). Everything else is refused, since nvcc's
#: other options reach the host compiler, the file system or a shell. docs/guide.md lists them.
ALLOWED_OPTIONS: tuple[str, ...] = (
    rf"-D{_MACRO}",
    rf"--define-macro={_MACRO}",
    r"-O[0-3]",
    r"--?use_fast_math",
    r"--?(?:ftz|prec-div|prec-sqrt|fmad)=(?:true|false)",
    r"-lineinfo|--generate-line-info",
    r"--?maxrregcount=[1-9][0-9]{0,2}",
    r"--?std=c\+\+(?:03|11|14|17|20)",
    r"--?restrict",
    r"--?extra-device-vectorization",
    r"--?expt-relaxed-constexpr",
    r"--?(?:expt-)?extended-lambda",
)
_ALLOWED = re.compile("|".join(f"(?:{option})" for option in ALLOWED_OPTIONS))
#: C++ and CUDA words no variable or kernel may be called.
_RESERVED = frozenset(
    """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
    char16_t char32_t class compl concept const consteval constexpr constinit const_cast
    continue co_await co_return co_yield decltype default delete do double dynamic_cast else
    enum explicit export extern false float for friend goto if inline int long mutable
    namespace new noexcept not not_eq nullptr operator or or_eq private protected public
    register reinterpret_cast requires return short signed sizeof static static_assert
    static_cast struct switch template this thread_local throw true try typedef typeid
    typename union unsigned using virtual void volatile wchar_t while xor xor_eq
    threadIdx blockIdx blockDim gridDim warpSize main""".split()
)
#: Names the generated elementwise code gives a meaning: the element index and count.
_ELEMENTWISE_NAMES = frozenset({"i", "n"})
#: Prefix of the generated code's own names (the pointer parameters).
_PREFIX = "erlcuda_"


class BadOption(ValueError):
    """An nvcc option that is not in ``ALLOWED_OPTIONS``; ``option`` is the flag as given."""

    def __init__(self, option: str) -> None:
        super().__init__(f"nvcc option {option!r:.80} is not allowed: erlcuda takes macros "
                         "(-DNAME=VALUE), -O0..-O3 and the precision flags docs/guide.md lists")
        self.option = option


def compile_module(source: str, options: Sequence[str], arch: str, *,
                   cache: str | os.PathLike[str] | None = None,
                   progress: Callable[[float], None] | None = None) -> bytes:
    """A cubin of a user's ``source`` for ``arch`` (``sm_90``) through the one cache
    (``compile.cubin``), once its ``options`` are allowed ones and it names no file but a
    header of the include path; ``progress(seconds)`` as for ``compile.cubin``."""
    return compile_entry(source, options, arch, cache=cache, progress=progress).image


def compile_entry(source: str, options: Sequence[str], arch: str, *,
                  cache: str | os.PathLike[str] | None = None,
                  progress: Callable[[float], None] | None = None) -> Compiled:
    """``compile_module``, saying whether the cache held the cubin."""
    opts = _checked(source, options)
    return cubin_entry(source, opts, arch, cache=cache, progress=progress)


def compile_host(source: str, options: Sequence[str],
                 kernels: Sequence[tuple[str, Sequence[tuple[str, str]]]], *, what: str,
                 cache: str | os.PathLike[str] | None = None,
                 progress: Callable[[float], None] | None = None) -> bytes:
    """A shared library of a user's ``source`` for the host (the cpu backend), with a
    launcher for each of ``kernels`` (``(name, [(access, type)])``, the params as a launch
    passes them), through the one cache (``compile.host_library``), once its ``options``
    are allowed ones and it names no file but a header of the include path. ``Unsupported``
    where it uses what the cpu backend cannot run (``what``, the kernel or module, is named
    in the message), found before anything is compiled."""
    return compile_host_entry(source, options, kernels, what=what, cache=cache,
                              progress=progress).image


def compile_host_entry(source: str, options: Sequence[str],
                       kernels: Sequence[tuple[str, Sequence[tuple[str, str]]]], *, what: str,
                       cache: str | os.PathLike[str] | None = None,
                       progress: Callable[[float], None] | None = None) -> Compiled:
    """``compile_host``, saying whether the cache held the library."""
    opts = _checked(source, options)
    return host_library_entry(hostcode.translation_unit(kernels), hostcode.host_options(opts),
                              files={SOURCE_NAME: source}, include_dirs=[hostcode.INCLUDE_DIR],
                              check=lambda text: hostcode.check(text, what), cache=cache,
                              progress=progress)


def _checked(source: str, options: Sequence[str]) -> list[str]:
    """A user's ``options`` as a list of allowed ones, once ``source`` holds no NUL byte and
    names no file but a header of the include path."""
    opts = _allowed(options)
    if "\0" in source:
        raise ValueError("the source holds a NUL byte")
    _check_file_names(source)
    return opts


def _allowed(options: Sequence[str]) -> list[str]:
    """``options`` as a list, each one checked against ``ALLOWED_OPTIONS``."""
    opts = list(options)
    for opt in opts:
        if not isinstance(opt, str):
            raise ValueError(f"bad nvcc option {opt!r:.60}: not a string")
        if not _ALLOWED.fullmatch(opt):
            raise BadOption(opt)
    return opts


# -- the files a source names ----------------------------------------------------------------
#
# A source may include headers of nvcc's and the system's include path, by a relative name
# without "..": the source is compiled alone in a private folder, and no option adds a path.
# A file named otherwise could be any file the worker can read, and nvcc's message shows its
# lines (gcc prints the line an error is on, read from the file #line or # N names). So every
# directive that names a file (#include and its kin, #line and the linemarker # N "file") and
# every __has_include must name one literally, in "" or <> (a macro could expand to any
# path), and by such a name. The check runs where the preprocessor could see a directive: at
# the start of a line or after a comment, once with trigraphs and once without (-std=c++14
# turns them on), on lines joined as the preprocessor joins them. It may refuse a source
# that only mentions such a directive in a comment; it never misses one the preprocessor takes.

#: Directives that read the file they name.
_INCLUDES = frozenset({"include", "include_next", "import", "embed"})
_TRIGRAPH = re.compile(r"\?\?[=/'()!<>-]")
_TRIGRAPHS = dict(zip("=/'()!<>-", "#\\^[]|{}~", strict=True))
#: A line splice; gcc takes a backslash followed by blanks too.
_SPLICE = re.compile(r"\\[ \t\f\v]*\n")
#: Where a directive may start: a line's first token, after blanks or comments (gcc skips a
#: byte order mark as well).
_DIRECTIVE = re.compile(r"(?:^|\*/)[ \t\f\v\ufeff]*(?:#|%:)", re.MULTILINE)
#: Blanks within a directive; a comment there (which may span lines) counts as one.
_BLANKS = re.compile(r"[ \t\f\v\ufeff]*")
_CLOSE = re.compile(r"\*/")
_WORD = re.compile(r"(?:[A-Za-z0-9_$]|\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8})+")
_UCN = re.compile(r"\\u([0-9A-Fa-f]{4})|\\U([0-9A-Fa-f]{8})")
_NUMBER = re.compile(r"[0-9]+")
_HEADER = re.compile(r'"[^"\n]*"|<[^>\n]*>')
_HAS_INCLUDE = re.compile(r"(?<![A-Za-z0-9_$])__has_(?:include_next|include|embed)(?:__)?"
                          r"(?![A-Za-z0-9_$])")
#: The contexts that ask whether __has_include exists, which name no file.
_TESTED = re.compile(r"(?<![A-Za-z0-9_$])(?:defined|ifdef|ifndef|elifdef|elifndef)"
                     r"(?![A-Za-z0-9_$])[ \t\f\v]*\(?")


def _check_file_names(source: str) -> None:
    """ValueError where ``source`` names a file that is not a header of the include path,
    or names one through a macro."""
    lines = source.replace("\r\n", "\n").replace("\r", "\n")
    for text in (lines, _TRIGRAPH.sub(lambda m: _TRIGRAPHS[m[0][2]], lines)):
        _Scan(_SPLICE.sub("", text)).check()


class _Scan:
    """One translation of a source (lines joined, trigraphs replaced or not), checked."""

    def __init__(self, text: str) -> None:
        self.text = text
        # Where each comment ends, found once: a skip looks its comment's end up, so that
        # many directives before one far "*/" cost no more than the text's length.
        self.closes = [m.start() for m in _CLOSE.finditer(text)]

    def check(self) -> None:
        for start in _DIRECTIVE.finditer(self.text):
            self.directive(self.skip(start.end()))
        self.has_include()

    def skip(self, pos: int) -> int:
        """The position after the blanks and comments at ``pos``."""
        text = self.text
        while True:
            blanks = _BLANKS.match(text, pos)
            pos = blanks.end() if blanks else pos
            if not text.startswith("/*", pos):
                return pos
            at = bisect.bisect_left(self.closes, pos + 2)
            if at == len(self.closes):
                return len(text)  # the rest is a comment
            pos = self.closes[at] + 2

    def directive(self, pos: int) -> None:
        text = self.text
        word = _WORD.match(text, pos)
        if word is None:
            return
        name = _UCN.sub(lambda m: chr(int(m[1] or m[2], 16)), word[0])
        if name in _INCLUDES:
            self.header(self.skip(word.end()), f"#{name}")
        elif name == "line" or _NUMBER.fullmatch(name):
            at = word.end()
            if name == "line":
                number = _NUMBER.match(text, self.skip(at))
                if number is None:
                    raise ValueError("#line takes a line number, not a macro")
                at = number.end()
            at = self.skip(at)
            if not (at == len(text) or text.startswith(("\n", "//"), at)):
                self.header(at, "#line", quoted_only=True)

    def has_include(self) -> None:
        """__has_include(NAME) as for #include; the bare word only where it is asked
        whether it exists (an alias could apply it to a macro)."""
        text = self.text
        tested = {self.skip(m.end()) for m in _TESTED.finditer(text)}
        for match in _HAS_INCLUDE.finditer(text):
            at = self.skip(match.end())
            if text.startswith("(", at):
                self.header(self.skip(at + 1), match[0])
            elif match.start() not in tested:
                raise ValueError(f"{match[0]} must be applied to a header name, or tested "
                                 "with defined or #ifdef")

    def header(self, pos: int, directive: str, *, quoted_only: bool = False) -> None:
        match = _HEADER.match(self.text, pos)
        if match is None or (quoted_only and match[0].startswith("<")):
            forms = '""' if quoted_only else '"" or <>'
            raise ValueError(f"{directive} must name its file as a header name ({forms}), "
                             "not through a macro")
        name = match[0][1:-1]
        if not name or name.startswith("/") or "\\" in name or ".." in name.split("/"):
            raise ValueError(f"{directive} {match[0][:80]}: a source includes only headers of "
                             "the include path, named relative to it and without '..' or '\\'")


# -- elementwise kernels ----------------------------------------------------------------------


def _check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"{what} {name!r:.60} is not a C identifier")
    if len(name) > MAX_NAME:
        raise ValueError(f"{what} {name[:40]}... is longer than {MAX_NAME} characters")
    if name in _RESERVED or name.startswith("__") or re.match("_[A-Z]", name):
        raise ValueError(f"{what} {name!r} is a reserved word of C++ or CUDA")
    if name.startswith(_PREFIX):
        raise ValueError(f"{what} {name!r}: names starting with {_PREFIX} are erlcuda's")
    return name


def _c_type(var: str, elem: object) -> str:
    c_type = C_TYPES.get(elem) if isinstance(elem, str) else None
    if c_type is None:
        raise ValueError(f"{var}: unknown element type {elem!r:.40} "
                         f"(one of {', '.join(C_TYPES)})")
    return c_type


def _input_params(inputs: Sequence[tuple[str, str, str]],
                  seen: set[str]) -> tuple[list[str], list[str]]:
    """The kernel params of ``inputs`` and the reads of its vector inputs into locals."""
    params: list[str] = []
    reads: list[str] = []
    for item in inputs:
        if len(item) != 3:
            raise ValueError(f"input {item!r:.60}: expected (name, type, vector | scalar)")
        var, elem, kind = item
        _check_var(var, seen)
        c_type = _c_type(var, elem)
        if kind == "scalar":
            params.append(f"const {c_type} {var}")
        elif kind == "vector":
            params.append(f"const {c_type}* __restrict__ {_PREFIX}{var}")
            reads.append(f"        const {c_type} {var} = {_PREFIX}{var}[i];")
        else:
            raise ValueError(f"input {var}: kind {kind!r:.20} is neither vector nor scalar")
    return params, reads


def elementwise_source(name: str, inputs: Sequence[tuple[str, str, str]],
                       outputs: Sequence[tuple[str, str]], operation: str) -> str:
    """CUDA C of the elementwise kernel ``name``:

    ``extern "C" __global__ void name(<inputs in order>, <output pointers>, long long n)``,
    an input ``(var, type, "vector")`` a ``const T*``, ``(var, type, "scalar")`` a ``T`` by
    value, an output ``(var, type)`` a ``T*``. A grid-stride loop over ``i < n`` reads each
    vector input into a local ``var``, zeroes a local per output, runs ``operation`` (a C
    statement over those names, ``i`` and ``n``) and stores the outputs. nvcc reports lines
    of the operation as ``operation(LINE)``.
    """
    _check_name("kernel name", name)
    if not isinstance(operation, str) or not operation.strip():
        raise ValueError("the operation is empty")
    if "\0" in operation:
        raise ValueError("the operation holds a NUL byte")
    if not outputs:
        raise ValueError("an elementwise kernel needs at least one output")
    seen = {name}
    params, reads = _input_params(inputs, seen)
    locals_: list[str] = []
    writes: list[str] = []
    for item in outputs:
        if len(item) != 2:
            raise ValueError(f"output {item!r:.60}: expected (name, type)")
        var, elem = item
        _check_var(var, seen)
        c_type = _c_type(var, elem)
        params.append(f"{c_type}* __restrict__ {_PREFIX}{var}")
        locals_.append(f"        {c_type} {var} = 0;")
        writes.append(f"        {_PREFIX}{var}[i] = {var};")
    params.append("const long long n")
    head = [
        f"// erlcuda elementwise kernel {name} (generated)",
        f'extern "C" __global__ void {name}(',
        "    " + ",\n    ".join(params) + ") {",
        "    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;",
        "         i < n; i += static_cast<long long>(gridDim.x) * blockDim.x) {",
        *reads,
        *locals_,
        "        {",
        '#line 1 "operation"',
        operation,
        ";",
    ]
    text = "\n".join(head)
    # Back to the file's own numbering after the operation: the directive is on line
    # lines + 1 and names the line after it.
    lines = text.count("\n") + 1
    tail = [f'#line {lines + 2} "{SOURCE_NAME}"', "        }", *writes, "    }", "}", ""]
    return "\n".join([text, *tail])


def _check_var(var: object, seen: set[str]) -> None:
    name = _check_name("variable", var)
    if name in _ELEMENTWISE_NAMES:
        raise ValueError(f"variable {name!r} is taken: i is the element index, n the count")
    if name in seen:
        raise ValueError(f"{name!r} is used twice (kernel name and variables must differ)")
    seen.add(name)
