"""Parts of ``python -m lab.freshcheck``: the lab's set-up proven on a freshly built Debian 12
machine, as ``vagrant up`` would provision it (see docs/freshcheck.md)."""
