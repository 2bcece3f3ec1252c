"""Reporting shared by the commands and the dashboard: pure figures from results and run
databases."""
