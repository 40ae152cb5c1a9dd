"""pure core: no I/O, no llama_cpp; imports only core and edgekv.errors."""
