"""User CUDA C built for the host, so that the cpu backend runs user kernels.

The source compiled is the user's CUDA C, unchanged, between two parts of erlcuda's:
before it the prelude (``hostinclude/erlcuda_host.h``: the qualifiers, the vector types,
``blockIdx``, ``threadIdx``, ``blockDim`` and ``gridDim`` as variables of the host thread,
the common device math), after it a launcher per kernel (``translation_unit``, the file
that includes the source): ``extern "C" int erlcuda_launch_<name>(void *const *args,
const unsigned *grid, const unsigned *block)`` loops over the grid's blocks and each
block's threads, sets the index variables and calls the kernel, so that every (block,
thread) pair runs its body once, as on a GPU. Beside it the library exports the kernel's
declared params (``erlcuda_sig_<name>``) and whether the source has a kernel of that name
that takes them (``erlcuda_found_<name>``), which the cpu backend reads as it loads the
library (``backends/hostlib.py``).

The threads run one after another on one host thread, so what needs them to run together
cannot run: shared memory, barriers, atomics, warp intrinsics, cooperative groups (and
inline PTX, textures, launches from a kernel, which the host has no such thing for).
``check`` finds them in the preprocessed source, before anything is compiled, and raises
``Unsupported`` naming each one and where it is.

nvcc's options (``usercode.ALLOWED_OPTIONS``) mean for the host build what they can
(``host_options``): macros, ``-O``, the language standard, ``--fmad``; the others change
only what nvcc makes for a GPU and are left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from . import elements
from .compile import SOURCE_NAME

__all__ = [
    "FOUND",
    "INCLUDE_DIR",
    "LAUNCH",
    "SIGNATURE",
    "Unsupported",
    "check",
    "host_options",
    "parse_signature",
    "signature",
    "translation_unit",
]

#: The prelude and the stand-ins for CUDA's own headers (``cuda_runtime.h``, ...).
INCLUDE_DIR = Path(__file__).resolve().parent / "hostinclude"
PRELUDE = "erlcuda_host.h"
#: The file name the launchers have in the compiler's messages.
LAUNCHERS = "erlcuda_launchers"
#: Prefixes of the symbols the library exports for each kernel.
LAUNCH, SIGNATURE, FOUND = "erlcuda_launch_", "erlcuda_sig_", "erlcuda_found_"

#: A kernel's param: its access (``in``, ``out``, ``inout`` or ``scalar``) and element type.
Param = tuple[str, str]
_ACCESS = ("in", "out", "inout", "scalar")


class Unsupported(Exception):
    """A source that uses what the cpu backend cannot run; the message says what and where."""


# -- the translation unit --------------------------------------------------------------------


def translation_unit(kernels: Sequence[tuple[str, Sequence[Param]]]) -> str:
    """The C++ the host compiles: the prelude, the user's source (``kernel.cu``, beside
    it), then a launcher for each kernel ``(name, params)``."""
    probes = "".join(f"inline erlcuda::none {name}(...) {{ return erlcuda::none(); }}\n"
                     for name, _ in kernels)
    parts = [
        f'#include "{PRELUDE}"',
        f'#include "{SOURCE_NAME}"',
        f'#line 1 "{LAUNCHERS}"',
        # A call of a kernel's name finds the source's kernel where it takes the declared
        # params, else this one (an ellipsis loses to any other match), which says so.
        f"namespace erlcuda_probe {{\n{probes}}}",
        "using namespace erlcuda_probe;",
        *(_launcher(name, params) for name, params in kernels),
    ]
    return "\n".join(parts) + "\n"


def _launcher(name: str, params: Sequence[Param]) -> str:
    types = [_c_type(etype) for _, etype in params]
    values = []
    for i, ((access, _), c_type) in enumerate(zip(params, types, strict=True)):
        values.append(f"*static_cast<const {c_type}*>(a[{i}])" if access == "scalar"
                      else f"static_cast<{c_type}*>(a[{i}])")
    probe = ", ".join(f"std::declval<{c_type}{'' if access == 'scalar' else '*'}>()"
                      for (access, _), c_type in zip(params, types, strict=True))
    export = 'extern "C" __attribute__((visibility("default")))'
    return "\n".join([
        f'{export} const char *const {SIGNATURE}{name} = "{signature(params)}";',
        f"{export} const int {FOUND}{name} = !std::is_same<decltype({name}({probe})), "
        "erlcuda::none>::value;",
        f"{export} int {LAUNCH}{name}(void *const *a, const unsigned int *g, "
        "const unsigned int *b) {",
        f"  return erlcuda::launch(g, b, [a]() {{ (void)a; {name}({', '.join(values)}); }});",
        "}",
    ])


def _c_type(etype: str) -> str:
    c_type = elements.C_TYPES.get(etype)
    if c_type is None:
        raise ValueError(f"unknown element type {etype!r:.40}")
    return c_type


def signature(params: Sequence[Param]) -> str:
    """The declared params as the library exports them: ``inout:f32,scalar:i64``."""
    for access, etype in params:
        if access not in _ACCESS:
            raise ValueError(f"unknown access {access!r:.40}")
        _c_type(etype)
    return ",".join(f"{access}:{etype}" for access, etype in params)


def parse_signature(text: str) -> list[Param]:
    """``signature``'s text, read back."""
    params: list[Param] = []
    for item in filter(None, text.split(",")):
        access, _, etype = item.partition(":")
        params.append((access, etype))
    if signature(params) != text:
        raise ValueError(f"not a signature: {text!r:.80}")
    return params


# -- nvcc's options, for the host ------------------------------------------------------------

_OPTIMIZE = re.compile(r"-O[0-3]")
_STANDARD = re.compile(r"--?std=(c\+\+[0-9]{2})")
_FMAD = re.compile(r"--?fmad=(true|false)")


def host_options(options: Sequence[str]) -> list[str]:
    """g++'s options for a source nvcc would compile with ``options`` (allowed ones, as
    ``usercode`` checks them): macros as they are; ``-O0``..``-O3`` (default ``-O2``); the
    standard (default C++17, as nvcc's; C++03 is built as C++11, which the launchers need);
    ``--fmad`` as whether a multiply and an add may be fused (nvcc's default: they may).
    Type punning through pointers is common in CUDA C, so strict aliasing is off; symbols
    are hidden but for the kernels (``__global__``) and the launchers, so that a function
    that is not a kernel cannot be loaded as one, as on a GPU."""
    standard, optimize, contract = "c++17", "-O2", "fast"
    macros: list[str] = []
    for option in options:
        if option.startswith("--define-macro="):
            macros.append("-D" + option.partition("=")[2])
        elif option.startswith("-D"):
            macros.append(option)
        elif _OPTIMIZE.fullmatch(option):
            optimize = option
        elif found := _STANDARD.fullmatch(option):
            standard = "c++11" if found[1] == "c++03" else found[1]
        elif found := _FMAD.fullmatch(option):
            contract = "fast" if found[1] == "true" else "off"
    return [f"-std={standard}", optimize, "-fno-strict-aliasing", f"-ffp-contract={contract}",
            "-fvisibility=hidden", *macros]


# -- what the cpu backend cannot run ---------------------------------------------------------

#: Each word the cpu backend refuses, by the feature it belongs to.
_FEATURES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (feature, re.compile(words)) for feature, words in (
        ("shared memory", r"__shared__"),
        ("barriers", r"__syncthreads\w*|__syncwarp|__barrier_sync"),
        ("atomics", r"atomic[A-Z]\w*"),
        ("warp shuffles", r"__shfl\w*"),
        ("warp votes", r"__ballot\w*|__any|__all|__any_sync|__all_sync|__uni_sync"
                       r"|__activemask|__match_\w+_sync|__reduce_\w+_sync"),
        ("cooperative groups", r"cooperative_groups"),
        ("inline assembly", r"asm|__asm|__asm__"),
        ("textures and surfaces", r"tex[123]D\w*|surf[123]D\w*|cudaTextureObject_t"
                                  r"|cudaSurfaceObject_t"),
        ("launches from a kernel", r"<<<"),
    ))
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|<<<")
_LITERAL = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
_MARKER = re.compile(r'#(?:line)?\s*([0-9]+)\s+"((?:\\.|[^"\\])*)"([0-9\s]*)$')
#: How many of the words found a refusal names.
_NAMED = 4


def check(text: str, what: str) -> None:
    """``Unsupported`` where the preprocessed ``text`` (g++ -E's output) uses, outside
    system headers and erlcuda's own, what the cpu backend cannot run; ``what`` names the
    kernel or module in the message."""
    found: dict[str, tuple[str, str]] = {}  # word -> (feature, where), first use first
    for where, line in _user_lines(text):
        for token in _TOKEN.findall(_LITERAL.sub('""', line)):
            if token in found:
                continue
            for feature, words in _FEATURES:
                if words.fullmatch(token):
                    found[token] = (feature, where)
                    break
    if found:
        uses = [f"{word} ({feature}, {where})" for word, (feature, where) in found.items()]
        more = len(uses) - _NAMED
        listed = ", ".join(uses[:_NAMED]) + (f" and {more} more" if more > 0 else "")
        raise Unsupported(f"{what} uses {listed}, which the cpu backend cannot run (it runs "
                          "a block's threads one after another); run it on the cuda backend")


def _user_lines(text: str) -> Iterator[tuple[str, str]]:
    """The lines of ``text`` that came from the user's source and its own headers, each
    with its ``file:line``: the preprocessor's line markers say where each line is from
    (and flag 3 a system header)."""
    ours = str(INCLUDE_DIR) + "/"
    name, number, wanted = "", 0, False
    for line in text.split("\n"):
        marker = _MARKER.match(line)
        if marker is not None:
            name, number = marker[2].replace('\\"', '"').replace("\\\\", "\\"), int(marker[1])
            wanted = not (name.startswith((ours, "<")) or name == LAUNCHERS
                          or "3" in marker[3].split())
            continue
        if wanted and line.strip():
            yield f"{name}:{number}", line
        number += 1
