"""How reports say counts (a leaf: every step's text may use it)."""


def plural(count, noun, many=None):
    """``1 cell``, ``2 cells``; ``many``: the plural where it is not the noun and an s (``1 entry``, ``2 entries``)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def did_you_mean(word, choices) -> str:
    """``; did you mean 'fork'?`` for a near miss of one of ``choices``, else nothing."""
    import difflib  # (only on the way to an error)

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
