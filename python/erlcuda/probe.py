"""Can this interpreter run the erlcuda worker? One line a check, for Erlang to read.

The port owner runs this file's text with ``python -c SOURCE [WORKER_MODULE]``, with the
worker's interpreter and environment, when a worker exits before its hello (and again,
instead of the worker, while the answer stays no): so that a newcomer reads "numpy is
missing in /usr/bin/python3" and the fix, rather than a traceback at every restart. ``-c``
and not ``-m``: it must run where the erlcuda package does not import.

Each line is ``erlcuda-probe<TAB>CHECK<TAB>STATUS<TAB>TEXT``; STATUS is ``ok`` or the word
for what is wrong, TEXT a version, a path, or the reason in words:

    executable  ok       sys.executable
    python      ok|old   its version (old: below MIN_PYTHON)
    numpy       ok|missing
    erlcuda     ok|missing   the package, from the worker's PYTHONPATH
    module      ok|missing   the worker module, when it is not erlcuda
    pycuda      ok|missing   (the cuda backend's; the worker runs without it)

Written to run on any Python, 2.7 included, so that an old one is named as such: no
f-strings, types in comments, the standard library only.
"""

import sys

#: The oldest Python the worker runs on (pyproject.toml's requires-python).
MIN_PYTHON = (3, 10)
PREFIX = "erlcuda-probe"


def line(check, status, text):
    # type: (str, str, object) -> str
    """One line of the probe's output (tabs and line breaks in ``text`` become spaces)."""
    text = " ".join(str(text).split())
    return "\t".join((PREFIX, check, status, text))


def reason(exc):
    # type: (BaseException) -> str
    return type(exc).__name__ + ": " + str(exc)


def importing(name):
    # type: (str) -> tuple[str, str]
    """``("ok", version)`` when module ``name`` imports, else ``("missing", why)``."""
    try:
        module = __import__(name)
        for part in name.split(".")[1:]:
            module = getattr(module, part)
    except Exception as exc:
        return "missing", reason(exc)
    top = sys.modules[name.split(".")[0]]
    return "ok", str(getattr(module, "__version__", getattr(top, "VERSION_TEXT",
                                                            getattr(top, "__version__", "?"))))


def finding(name):
    # type: (str) -> tuple[str, str]
    """``("ok", path)`` when module ``name`` is found on the path (not imported), else
    ``("missing", why)``."""
    try:
        import importlib.util

        spec = importlib.util.find_spec(name)
    except Exception as exc:
        return "missing", reason(exc)
    if spec is None:
        return "missing", "no module named " + name
    return "ok", str(spec.origin)


def checks(worker_module, version=None):
    # type: (str, tuple[int, ...] | None) -> collections.abc.Iterator[str]
    """Every check's line, in order, each as soon as it is made: a check that crashes the
    interpreter (a broken native module) leaves the lines before it. PyCUDA's comes last."""
    if version is None:
        version = sys.version_info
    text = ".".join(str(part) for part in version[:3])
    old = tuple(version[:2]) < MIN_PYTHON
    wanted = ".".join(str(part) for part in MIN_PYTHON)
    yield line("executable", "ok", sys.executable)
    yield line("python", "old" if old else "ok",
               text + " (erlcuda needs " + wanted + " or later)" if old else text)
    for name, import_name in (("numpy", "numpy"), ("erlcuda", "erlcuda")):
        status, found = importing(import_name)
        yield line(name, status, found)
    if worker_module and worker_module != "erlcuda":
        status, found = finding(worker_module)
        yield line("module", status, found)
    status, found = importing("pycuda.driver")
    yield line("pycuda", status, found)


def main(argv):
    # type: (list[str]) -> int
    for text in checks(argv[1] if len(argv) > 1 else "erlcuda"):
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
