"""edges: each module owns one outside thing (files, network, llama.cpp, processes, the OS)."""
