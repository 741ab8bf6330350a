"""Reports: tables and plots from simulated and measured runs."""
