"""orchestration: sweeps, quality runs, budgets; builds records, renders nothing."""
