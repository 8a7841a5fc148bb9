"""How reports say counts (a leaf: every step's text may use it)."""


def plural(count, noun, many=None):
    """``1 cell``, ``2 cells``; ``many``: the plural where it is not the noun and an s (``1 entry``, ``2 entries``)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def release(version) -> str:
    """The release a build is of (``2.14.1+cu130`` -> ``2.14.1``; none: ""): windows, pins and ranges name
    releases, an environment reports its local build."""
    return str(version or "").split("+")[0]


def did_you_mean(word, choices) -> str:
    """``; did you mean 'fork'?`` for a near miss of one of ``choices``, else nothing."""
    import difflib  # (only on the way to an error)

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
