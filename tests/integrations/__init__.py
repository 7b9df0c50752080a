"""The drop-ins, run inside the frameworks they join (mjlab, rsl_rl, holosoma, MotrixLab)."""
