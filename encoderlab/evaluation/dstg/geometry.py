"""Geometry of learned absolute positions (the DSTG paper's Section 4 and appendix B.1, Figure 4).

- The position table (positions x channels): PCA (cumulative explained variance, the first principal
  components as functions of position) and the DCT-II power spectrum of each component, summarised as the
  share of power in the lowest `LOW_BINS` frequency bins. Works on DSTG's AP table, the ``ap`` baseline's table
  and any transformers checkpoint with a learned position table (e.g. a local BERT folder).
- The AP hidden states of a DSTG model (one long document): per layer, a 2-D PCA coloured by sentence and the
  variance its two components hold.

The command is ``encoderlab analyze dstg-geometry`` (`geometry_cli`); the figures are `figures.plot_table` and
`figures.plot_ap_states`.
"""

import numpy as np
import torch
from scipy.fft import dct

from .states import require_dstg

LOW_BINS = 4
"""The paper's low-frequency band: the first four DCT-II bins."""
SHOWN_COMPONENTS = 3


def position_table(model):
    """(positions, channels) float64 array of the model's learned absolute position table: DSTG's AP table, or
    the ``nn.Embedding`` named ``position_embeddings`` (BERT, RoBERTa, ELECTRA, the ``ap`` baseline, ...)."""
    if getattr(model.config, "is_disentangled", False):
        return model.embeddings.ap_embeddings.weight.detach().double().numpy()
    tables = [
        module
        for name, module in model.named_modules()
        if name.split(".")[-1] == "position_embeddings" and isinstance(module, torch.nn.Embedding)
    ]
    if len(tables) != 1:
        preset = getattr(model.config, "preset", None)
        described = model.config.model_type + (f", preset {preset!r}" if preset else "")
        raise ValueError(
            f"{type(model).__name__} ({described}) has {len(tables)} learned position tables "
            "(nn.Embedding modules named 'position_embeddings'); AP geometry needs exactly one"
        )
    return tables[0].weight.detach().double().numpy()


def pca(table):
    """PCA of the rows of `table` (positions as samples): (explained variance ratio (k,), components as functions
    of position (positions, k)), components ordered by variance, k = min(positions, channels)."""
    centred = table - table.mean(axis=0, keepdims=True)
    left, singular, _ = np.linalg.svd(centred, full_matrices=False)
    variance = singular**2
    return variance / variance.sum(), left * singular


def dct_power(signal):
    """Normalised DCT-II power spectrum of a 1-D signal (orthonormal transform, so the powers sum to 1)."""
    power = dct(np.asarray(signal, dtype=float), type=2, norm="ortho") ** 2
    return power / power.sum()


def table_geometry(table, components=SHOWN_COMPONENTS):
    """Summary of a position table: cumulative variance, the first `components` PCs and their low-band shares."""
    ratios, projected = pca(table)
    shown = projected[:, :components]
    return {
        "cumulative_variance": np.cumsum(ratios),
        "components": shown,
        "low_frequency_share": [float(dct_power(shown[:, k])[:LOW_BINS].sum()) for k in range(shown.shape[1])],
        "variance_ratio": ratios,
    }


def geometry_rows(table):
    """CSV rows: per principal component its variance share, the cumulative share and its low-band power."""
    summary = table_geometry(table, components=table.shape[1])
    return [
        {
            "component": k + 1,
            "variance_ratio": float(summary["variance_ratio"][k]),
            "cumulative_variance": float(summary["cumulative_variance"][k]),
            "low_frequency_share": summary["low_frequency_share"][k],
        }
        for k in range(len(summary["variance_ratio"]))
    ]


def ap_state_projections(model, document):
    """Per layer output (embeddings first), the 2-D PCA of the AP hidden states of one document's content tokens
    and the variance share of those two components: [(points (n, 2), share)]."""
    require_dstg(model, "AP hidden-state geometry")
    input_ids = torch.tensor([document.input_ids])
    with torch.no_grad():
        outputs = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), output_hidden_states=True)
    projections = []
    for state in outputs.ap_hidden_states:
        ratios, projected = pca(state[0, 1:-1].double().numpy())
        projections.append((projected[:, :2], float(ratios[:2].sum())))
    return projections
