"""machine: readings of this machine (environment fingerprint, available memory, load, bandwidth, the code's
identity)."""
