"""Tiny checkpoints the fine-tuning tests start from, and the check that two runs saved the same weights."""

import torch
from safetensors.torch import load_file


def save_tiny_dta_mlm(folder, tokenizer, num_hidden_layers=2):
    """A freshly initialised (seed 0) DTA-BERT masked LM of width 32 with `tokenizer`'s vocabulary, saved with the
    tokenizer into `folder`, which is returned."""
    from encoderlab import DTABertConfig, DTABertForMaskedLM

    torch.manual_seed(0)
    config = DTABertConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=32,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=2,
        intermediate_size=64,
    )
    DTABertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def assert_same_saved_weights(expected_dir, actual_dir, atol=1e-6):
    """The two run folders' model.safetensors hold the same tensors, to `atol`."""
    expected, actual = load_file(expected_dir / "model.safetensors"), load_file(actual_dir / "model.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=atol, msg=name)
