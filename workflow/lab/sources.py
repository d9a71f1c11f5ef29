"""Which source code a table, a figure or the report depends on: read from the syntax tree, never run.

A module depends on the project modules it imports (imports inside functions count too), followed
transitively; a name taken from ``kernels`` leads to the kernel module whose ``__all__`` lists it.
Within a lab unit (lab/units/<kernel>.py), which declares everything the lab does with one kernel, a
declaration depends on its own definition and the top-level definitions and imports it uses, not on
the rest of the file: editing a figure of a unit reruns none of its experiments. A name taken from
another unit (``from .softmax import NAIVE``) counts as that name's slice of it.

Registries and discovery (``REGISTRIES``) are left out: they decide *which* experiments exist, not what
any of them computes, so adding a unit or a kernel module changes no other table's hash. The hash reads
the code, not what explains it: comments, docstrings and blank lines are left out (``code_only``), so
correcting a comment reruns nothing.
"""
from __future__ import annotations

import ast
import hashlib
import io
import tokenize
import warnings
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"kernels": ROOT / "kernels", "lab": ROOT / "workflow" / "lab"}
REGISTRIES = frozenset({"kernels/__init__.py", "workflow/lab/units/__init__.py"})


def path_of(module: str) -> Path | None:
    """kernels._softmax -> <root>/kernels/_softmax.py; None outside this project."""
    top, *rest = module.split(".")
    if top not in PACKAGES:
        return None
    base = PACKAGES[top].joinpath(*rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()  # the same text, and so the same hash, on every system


@lru_cache(maxsize=None)
def _kernel_exports() -> dict[str, str]:
    import kernels  # no side effects: reads the kernel modules' __all__ from their source

    return {name: f"kernels.{module}" for name, module in kernels.exports().items()}


def _source(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a `from ... import` in ``module``'s file takes names from (relative imports resolved)."""
    package = (module if path.name == "__init__.py" else module.rsplit(".", 1)[0]).split(".")
    base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
    return ".".join(p for p in (base, node.module or "") if p)


def _imported(module: str, path: Path, nodes) -> set[str]:
    """The modules the import statements among ``nodes`` (syntax nodes of ``module``'s file) load."""
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _source(module, path, node)
            found.add(source)
            for alias in node.names:  # `from pkg import name`: name may be a submodule or a kernel export
                found.add(f"{source}.{alias.name}")
                if source == "kernels":
                    found.add(_kernel_exports().get(alias.name, ""))
    # a module's parent packages run first
    return {m for f in found if f for m in (f, *(f.rsplit(".", i)[0] for i in range(1, f.count(".") + 1)))}


@lru_cache(maxsize=None)
def closure(module: str) -> tuple[str, ...]:
    """Project source files ``module`` runs, relative to the project root, sorted; registries left out."""
    seen, todo = {}, [module]
    while todo:
        name = todo.pop()
        path = path_of(name)
        if path is None or path in seen.values() or _relative(path) in REGISTRIES:
            continue
        seen[name] = path
        todo.extend(_imports_of(name, path) - set(seen))
    return tuple(sorted(_relative(p) for p in seen.values()))


@lru_cache(maxsize=None)  # closures from different modules share most files
def _imports_of(module: str, path: Path) -> frozenset[str]:
    """The modules every import statement of ``module``'s file loads."""
    return frozenset(_imported(module, path, ast.walk(ast.parse(path.read_text()))))


def _top_level_names(node) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def _alias_line(node, alias) -> str:
    """One imported name as its own import statement (what a slice depends on is the names it uses)."""
    name = f"{alias.name} as {alias.asname}" if alias.asname else alias.name
    if isinstance(node, ast.Import):
        return f"import {name}"
    return f"from {'.' * node.level}{node.module or ''} import {name}"


@lru_cache(maxsize=None)
def _slice(module: str, names: tuple[str, ...]) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The part of ``module``'s source that the top-level ``names`` use: their definitions, the top-level
    definitions and imported names those use (transitively), and every top-level statement that defines
    nothing (it always runs). Returns (that source, the project files its imports run, whole, and the other
    units it takes names from, whose slices are part of that source)."""
    path = path_of(module)
    text = path.read_text()
    body = ast.parse(text).body
    defines = {}
    for node in body:
        for name in _top_level_names(node):
            defines.setdefault(name, []).append(node)
    kept = [n for n in body if not _top_level_names(n) and not (n is body[0] and isinstance(n, ast.Expr))]
    used = set(names)
    todo = list(names) + [x.id for n in kept for x in ast.walk(n) if isinstance(x, ast.Name)]
    while todo:
        name = todo.pop()
        used.add(name)
        for node in defines.pop(name, []):
            if node not in kept:
                kept.append(node)
                todo.extend(x.id for x in ast.walk(node) if isinstance(x, ast.Name))
    lines, parts, imports, files, units = text.splitlines(), [], [], set(), set()
    for node in sorted(kept, key=lambda n: n.lineno):
        if isinstance(node, (ast.Import, ast.ImportFrom)):  # of a top-level import, only the names used
            for alias in node.names:
                if (alias.asname or alias.name).split(".")[0] not in used:
                    continue
                parts.append(_alias_line(node, alias))
                other = _unit_of(module, path, node, alias)
                if other:  # a name from another unit: only that name's slice of it
                    source, more, their_units = _slice(other, (alias.name,))
                    parts.append(source)
                    files |= set(more)
                    units |= {*their_units, _relative(path_of(other))}
                else:
                    imports.append(type(node)(**{**node.__dict__, "names": [alias]}))
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        parts.append("\n".join(lines[first - 1:node.end_lineno]))
        imports.extend(x for x in ast.walk(node) if isinstance(x, (ast.Import, ast.ImportFrom)))  # inside functions
    files |= {f for m in _imported(module, path, imports) for f in closure(m)}
    own = {_relative(path)}
    return "\n".join(parts), tuple(sorted(files - own)), tuple(sorted(units - own))


def _unit_of(module: str, path: Path, node, alias) -> str | None:
    """The unit module a top-level `from .<unit> import <name>` takes a definition from (None otherwise)."""
    if not isinstance(node, ast.ImportFrom) or not node.level or not node.module:
        return None
    source = _source(module, path, node)
    unit = path_of(source)
    if (source.startswith("lab.units.") and unit is not None and unit.name != "__init__.py"
            and path_of(f"{source}.{alias.name}") is None):
        return source
    return None


def declaration_code(module: str, *names: str) -> tuple[list[str], str]:
    """What a unit's declaration (a function named in ``names``, defined in ``module``) depends on: the
    files it runs (its own module's file included, as the job's input) and the content hash of exactly
    the code it depends on (the slice of its own module and of any unit it takes names from, the whole of
    every other file)."""
    source, files, units = _slice(module, tuple(sorted(names)))
    h = hashlib.sha256(code_only(source).encode() + b"\0" + digest(files).encode())
    return sorted({*files, *units, _relative(path_of(module))}), h.hexdigest()[:16]


def digest(files) -> str:
    """Content hash of ``files`` (paths relative to the project root): what changes when code changes
    (a Python file's code_only, any other file's bytes)."""
    h = hashlib.sha256()
    for f in sorted(files):
        data = (ROOT / f).read_bytes()
        h.update(f.encode() + b"\0" + (code_only(data.decode()).encode() if f.endswith(".py") else data) + b"\0")
    return h.hexdigest()[:16]


@lru_cache(maxsize=None)  # a plan hashes the same files for many declarations
def code_only(text: str) -> str:
    """Python source less its comments, its docstrings (each on lines of its own) and its blank lines and
    trailing blanks outside string literals. Line-based, not ast.dump (whose output differs between Python
    versions), so the hash is the same wherever it is computed. Text that does not parse is returned as it is."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # as Python reads a source file
    lines = text.split("\n")  # as tokenize and ast count lines (splitlines also breaks at \x0c, \u2028...)
    try:
        with warnings.catch_warnings():  # an invalid escape is a SyntaxWarning, an error under -W error
            warnings.simplefilter("ignore")
            tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
            tree = ast.parse(text)
    except (SyntaxError, ValueError, tokenize.TokenError):
        return text
    for token in tokens:
        if token.type == tokenize.COMMENT:  # a comment runs to the end of its line
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    verbatim = set()  # lines that end inside a multi-line string: their blanks are the string's content
    for node in ast.walk(tree):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and node.end_lineno > node.lineno:
            verbatim.update(range(node.lineno - 1, node.end_lineno - 1))
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        doc = node.body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
            continue
        before = lines[doc.lineno - 1].encode()[:doc.col_offset]  # ast's columns count UTF-8 bytes
        after = lines[doc.end_lineno - 1].encode()[doc.end_col_offset:]
        if not before.strip() and not after.strip():  # not `def f(): """..."""` nor `"""..."""; x = 1`
            lines[doc.lineno - 1:doc.end_lineno] = [None] * (doc.end_lineno - doc.lineno + 1)
    return "\n".join(line if i in verbatim else line.rstrip() for i, line in enumerate(lines)
                     if line is not None and (i in verbatim or i - 1 in verbatim or line.strip()))
