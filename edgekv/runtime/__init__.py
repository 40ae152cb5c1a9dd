"""runtime: llama.cpp and the processes edgekv starts (dry runs, measured children, memory sampling, llama-server)."""
