"""sweep: ``edgekv bench``'s measured sweeps: plan, spec, runners per engine, records, what it says while it runs."""
