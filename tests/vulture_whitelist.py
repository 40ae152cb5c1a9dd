"""Names vulture (tests/checks/test_lint.py) reports as unused that are used, each with where the use is.

Read by vulture only (as Python source); never imported."""
# ruff: noqa
# fmt: off

# typer commands and the app callback: registered by decorators, called by typer
_root
# the commands' functions, imported by name from edgekv.cli.main.COMMANDS when dispatched
merge

# the package's lazy attributes (PEP 562): Python calls a module's __getattr__ (edgekv/__init__.py)
__getattr__
models_list
models_show
models_pull

# fields of llama.cpp's C structs (ctypes): set here, read by llama.cpp
_.load_mode             # llama_model_params.load_mode (engine.model_params, workload.bench)
_.no_alloc              # llama_model_params.no_alloc
_.flash_attn_type       # llama_context_params.flash_attn_type
_.n_threads_batch       # llama_context_params.n_threads_batch

# dataclass fields of parsed llama.cpp output and of ModelShape: carried whole (asdict) into the child's
# answers and the results records, read by whoever reads those
seqs                    # KVCacheLine: llama.cpp's "seqs" in the KV-cache line
p_mib                   # KVCacheLine: the "P (f32)" part of a DSV4 cache line
_.swa_full_warned       # LlamaMemoryLog
_.v_padding             # LlamaMemoryLog
is_recurrent            # ModelShape.layers[i].is_recurrent

# edgekv/records/schema.py: public names for notebooks and maintainers (not called inside edgekv)
_.KINDS                 # the record kinds, documented beside Record.kind
_.PROVENANCE            # which source each block's numbers come from (formula / llama.cpp / measured)
_.write_schema_file     # regenerates results.schema.json; named by tests/unit/records/test_records.py's failure message

# edgekv/core/speed.py: SpeedTestPrediction fields, written into prediction.speed by msgspec
_.bytes_per_token       # the bytes a decoded token reads (the roofline's denominator), in --json and records
# wire fields of the bench child's typed reply (core/benchwire.py): set by the child, decoded strictly by the parent
n_params                # ModelFacts.n_params: llama_model_n_params, reported beside size_bytes

# called by name through edgekv.child.worker.SUBCOMMANDS (importlib)
speed_probe  # edgekv/child/speedprobe.py
env_info  # edgekv/child/workload.py
engine  # edgekv/child/dryrun_child.py

# written into the environment block's device_details (edgekv.machine.environment.collect, to_wire)
_.memory_free  # edgekv/core/childwire.py GgmlDevice
