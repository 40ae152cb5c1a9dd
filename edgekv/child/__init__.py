"""child side: code that runs inside a measured child process; imports core and edges only."""
