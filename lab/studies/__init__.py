"""One-off studies: measurements behind the design, run as ``python -m lab.studies.<name>``.

Only tests and other studies import these modules; the user commands never do.
"""
