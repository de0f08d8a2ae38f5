"""The encoderlab model families, their shared layers, attention kernels and task heads."""
