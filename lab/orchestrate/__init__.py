"""Running a lab: the runner (processes, commands, monitor loop), faults, the command
vocabulary the dashboard writes, and the headless browser used by tests and benchmarks."""
