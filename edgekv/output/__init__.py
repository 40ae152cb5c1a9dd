"""output: reports, comparisons, plots and terminal views; measures nothing."""
