"""``encoderlab finetune``: fine-tuning on GLUE, SQuAD, TAPE and your own data (see `tasks` for the registry)."""
