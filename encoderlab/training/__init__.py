"""Pretraining and fine-tuning on top of the HF Trainer."""
