"""Step 7: the run's reports, rendered from its records alone: the terminal table (tables.py), the status
markdown (markdown.py, status.py), the HTML page (page.py), the comparison with an older run (compare.py), the
coverage of upstream's suite (coverage.py), and the report tool (tool.py, ``python -m pytest_simplefsdp.report``)."""
