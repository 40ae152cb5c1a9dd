"""calibration: this machine measured once and stored: the runtime baseline, the speed calibration, the extra-buffer
preflight."""
