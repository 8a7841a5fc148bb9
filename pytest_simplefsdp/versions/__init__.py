"""Versions as a dimension: version sets (sets.py), their environments built with uv (envs.py), and bisection to
the window where a cell's behaviour changes (bisect.py). The twin table is a report (report/twin.py)."""
