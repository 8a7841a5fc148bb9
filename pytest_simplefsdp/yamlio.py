"""The YAML the plugin reads (matrix files, known failures): loaded with line numbers, so that every problem
names the file, the line and the value."""

from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError


class MatrixError(Exception):
    """An input file (a matrix file, a known-failures file) that cannot be used; the message names file, line
    and value."""


def plain(node):
    """ruamel's commented containers -> plain dicts/lists (values keep their types)."""
    if isinstance(node, dict):
        return {k: plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    return node


def line_of(path, node, key=None, index=None):
    try:
        if key is not None:
            line = node.lc.key(key)[0]
        elif index is not None:
            line = node.lc.item(index)[0]
        else:
            line = node.lc.line
        return f"{path}:{line + 1}"
    except (AttributeError, KeyError, IndexError, TypeError):
        return str(path)


def parse_yaml(text, path):
    """Parse YAML text in round-trip mode (keeps line numbers); errors name the file and line."""
    try:
        return YAML(typ="rt").load(text)
    except YAMLError as e:
        # the parser notices a problem where it stops (often the next line); the construct it was reading
        # (context) starts where the typo is
        mark, context = getattr(e, "problem_mark", None), getattr(e, "context_mark", None)
        where = f"{path}:{(context or mark).line + 1}" if (context or mark) else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if context and mark and context.line != mark.line:
            problem = f"{getattr(e, 'context', None) or 'here'}: {problem} (noticed at line {mark.line + 1})"
        raise MatrixError(f"{where}: not valid YAML: {problem}") from None


def load_yaml(path):
    """Load a YAML file in round-trip mode; errors name file and line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise MatrixError(f"{path}: cannot read: {e.strerror}") from None
    return parse_yaml(text, path)
