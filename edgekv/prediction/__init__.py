"""prediction: what ``edgekv predict`` computes from a header and this machine's calibration (rows, whole process,
speed, budgets, fit)."""
