"""Configurations of the encoderlab families (`EncoderConfig` and one module per family)."""
