"""GPU part 2: throughput against ModernBERT, BERT and the HOMA paper, measured in one run.

Sections (``--sections``, in this order, each skipped and reported so when the time budget is spent):

* ``ceiling``: the bf16 matrix-product rate on random data, measured now: what TFLOP/s are read against.
* ``attention``: the attention op alone, forward + backward, bf16, B * L fixed, L = 1k..32k: dual triangle (6 heads
  of 128 = 12 triangle halves of 64) against bidirectional and causal (12 heads of 64), through every kernel this
  encoderlab has. FLOPs: 4 * B * H * L^2 * D for a full forward, halved for causal and dual triangle, times 3.5 for
  forward + backward (FlashAttention's count: the backward is 2.5 forwards).
* ``homa``: HOMA at the paper's secondary-structure shape (d 512, 12 layers, 8 heads, L 512, l 30, s 15, r 8,
  batch 16), w = 3 / 5 / 7, against pairwise attention and Blockwise-2D: token-positions per second of a training
  step, and peak memory. On a GPU with Triton, HOMA runs its fused triadic kernel, and at w = 3 and 7 also the
  torch kernel, for the ratio between them.
* ``models``: the whole-model MLM training step (bf16 autocast, AdamW), tokens per second at 12 x 768: DTA-BERT
  through each of its GPU kernels (`dta_arms`: sdpa, sdpa + torch.compile, flex_attention + compile; varlen on
  packed rows) against transformers' ModernBertForMaskedLM and BertForMaskedLM (sdpa), at L = 512 / 1024 / 4096
  fixed, and on real length distributions (UniProt at 1024, SST-2 at 128): padded batches for the baselines, packed
  rows for DTA-BERT; useful tokens per second. DTA-BERT and ModernBERT run the MLM head on the masked positions only
  (``sparse_prediction``, what `encoderlab pretrain` trains with; BERT has no such option). Each DTA-BERT row also
  says how long the forward's attention inputs take to build (masks, BlockMask, varlen layout) and how many graphs
  torch.compile made for the workload's batches (one per shape; more is recompilation).
* ``memory``: peak memory of one step and the largest batch that fits at L = 4096, DTA-BERT against ModernBERT
  (uncompiled, so that each batch size costs no compilation).
* ``profile``: torch.profiler over DTA-BERT training steps at L = 4096: device kernel time against wall time
  (the rest is launch gaps and host work such as mask building), and the top operators.

Timing: warm-up calls first, then CUDA events around each call, the median of the repeats. The targets are
read off the tables at the end (`throughput_report.targets`). Files in --out: throughput_{attention,homa,models,
memory}.csv, throughput_profile.txt and throughput_summary.json (environment, ceiling, targets, profile numbers).
"""

import gzip
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import throughput_report  # noqa: E402

SECTIONS = ("ceiling", "attention", "homa", "models", "memory", "profile")
FORWARD_BACKWARD = 3.5  # FLOPs of forward + backward over the forward's (backward = 2.5 forwards)
HOMA_PAPER_A100 = {3: (3.1e4, 14.6), 7: (1.5e4, 38.9)}  # w -> (token-positions/s, GB), the paper's A100 numbers


def attention_flops(attention_type: str, batch: int, seq_len: int, heads: int, head_dim: int) -> float:
    """Forward + backward FLOPs of one attention call: two L x L x D products per head, halved for a triangle."""
    full = 4 * batch * heads * seq_len**2 * head_dim
    return FORWARD_BACKWARD * full * (1.0 if attention_type == "bidirectional" else 0.5)


def attention_shapes(attention_type: str) -> tuple[int, int]:
    """(heads, head size) at width 768: dual triangle heads are twice as wide, so both have 12 halves of 64."""
    return (6, 128) if attention_type == "dual_triangle" else (12, 64)


def attention_step(q, k, v, grad, attention_type: str, implementation: str) -> None:
    """One forward and backward of the attention op alone."""
    from encoderlab.modeling.attention import attend

    output, _ = attend(q, k, v, attention_type=attention_type, implementation=implementation, training=True)
    output.backward(grad)


def bench_attention(context, table, implementations, budget_end: float, ceiling: float) -> None:
    import torch

    lengths = (64, 128) if context.quick else (4096, 16384, 1024, 32768)  # the targets' lengths (>= 4k) first
    tokens = 256 if context.quick else 32768
    dtype = torch.bfloat16 if context.on_gpu else torch.float32
    for seq_len in lengths:
        batch = max(1, tokens // seq_len)
        results = {}
        if context.clock() > budget_end:
            table.add(L=seq_len, batch=batch, note="skipped: time budget spent")
            continue
        for attention_type in ("dual_triangle", "bidirectional", "causal"):
            if context.clock() > budget_end:
                table.add(L=seq_len, batch=batch, attention=attention_type, note="skipped: time budget spent")
                continue
            heads, head_dim = attention_shapes(attention_type)
            q, k, v = (
                torch.randn(batch, heads, seq_len, head_dim, device=context.device, dtype=dtype, requires_grad=True)
                for _ in range(3)
            )
            grad = torch.randn_like(q)
            for implementation in implementations:
                step = partial(attention_step, q, k, v, grad, attention_type, implementation)
                try:
                    ms = common.median_ms(
                        step, context.device, warmup=2 if context.quick else 5, repeat=3 if context.quick else 10
                    )
                except Exception as error:  # a kernel that refuses the shape is a row, not a crash
                    table.add(
                        L=seq_len,
                        batch=batch,
                        attention=attention_type,
                        implementation=implementation,
                        note=common.error_note(error),
                    )
                    continue
                tflops = attention_flops(attention_type, batch, seq_len, heads, head_dim) / (ms * 1e-3) / 1e12
                results[(attention_type, implementation)] = ms
                table.add(
                    L=seq_len,
                    batch=batch,
                    attention=attention_type,
                    implementation=implementation,
                    ms=ms,
                    tflops=tflops,
                    **{"of ceiling": tflops / ceiling},
                )
        for row in table.rows:  # each type over bidirectional on the same kernel (target: dual <= 0.55)
            key = ("bidirectional", row["implementation"])
            if row["L"] == seq_len and key in results and row["ms"] != "":
                row["ms / bidirectional"] = row["ms"] / results[key]


def train_step_fn(model, batch: dict, device: str, optimizer):
    import torch

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def mlm_labels(input_ids, attention_mask, generator):
    import torch

    chosen = (torch.rand(input_ids.shape, generator=generator) < 0.15) & attention_mask.bool()
    return input_ids.masked_fill(~chosen, -100)


def model_sizes(quick: bool) -> dict:
    if quick:
        return dict(hidden=32, layers=2, heads=2, vocab=512)
    return dict(hidden=768, layers=12, heads=12, vocab=30528)


def build_models(context, max_len: int, names=("DTA-BERT", "ModernBERT", "BERT")) -> dict:
    """name -> model on the device, in training mode. DTA-BERT with 6 heads of 128 (dual triangle); the
    baselines as transformers builds them, sdpa attention."""
    from transformers import BertConfig, BertForMaskedLM, ModernBertConfig, ModernBertForMaskedLM

    from encoderlab import DTABertConfig, DTABertForMaskedLM

    size = model_sizes(context.quick)
    hidden, layers, heads, vocab = size["hidden"], size["layers"], size["heads"], size["vocab"]
    dta = DTABertForMaskedLM(
        DTABertConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads // 2,
            intermediate_size=8 * hidden // 3,  # SwiGLU at 8/3 d: BERT's MLP parameter count
            max_position_embeddings=max_len,
            attention_type="dual_triangle",
            position_embedding_type="none",
            sparse_prediction=True,
        )
    )
    modern = ModernBertForMaskedLM(
        ModernBertConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=int(1.5 * hidden),
            max_position_embeddings=max_len,
            pad_token_id=0,
            cls_token_id=1,
            sep_token_id=2,
            bos_token_id=1,
            eos_token_id=2,
            sparse_prediction=True,
        )
    )  # ModernBERT-base's MLP (GLU 1152)
    bert = BertForMaskedLM(
        BertConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
            max_position_embeddings=max_len,
        )
    )
    models = {
        name: model for name, model in (("DTA-BERT", dta), ("ModernBERT", modern), ("BERT", bert)) if name in names
    }
    for model in models.values():
        model.set_attn_implementation("sdpa")
        model.to(context.device).train()
    return models


def dta_arms(context, packed: bool) -> list:
    """(kernel, compiled) pairs DTA-BERT runs a workload with: on a GPU sdpa plain and compiled, flex_attention
    compiled, and on packed rows varlen (one fused call per triangle already; compiled around, it would recompile for
    every batch's number of documents); on a CPU sdpa (the only kernel with a CPU backward everywhere)."""
    if not context.on_gpu:
        return [("sdpa", False)]
    arms = [("sdpa", False)]
    if context.compile:
        arms += [("sdpa", True), ("flex_attention", True)]
    else:
        arms += [("flex_attention", False)]
    if packed and "varlen" in common.attention_implementations():
        arms.append(("varlen", False))
    return arms


def mask_build_ms(model, batch: dict, device: str) -> float:
    """Milliseconds one forward spends building its attention inputs for `batch` (the BlockMask, the sdpa masks and
    spans, the varlen layout): what the kernels' own time does not show."""
    from encoderlab.modeling.attention import attention_inputs_type

    inner, input_ids, attention_mask = model.model, batch["input_ids"], batch["attention_mask"]
    position_ids = batch.get("position_ids")
    hidden_states = inner.embeddings(input_ids, None, position_ids)  # (B, L, hidden), as the forward has it

    def build():  # the forward's steps: the documents read from the positions, then the kernel's inputs
        _, document_ids = inner.read_inputs(input_ids, None, attention_mask, position_ids, None)
        attention_inputs_type(inner, hidden_states).build(
            attention_mask,
            document_ids,
            hidden_states,
            attention_type=model.config.attention_type,
            num_heads=model.config.num_attention_heads,
        )

    return common.median_ms(build, device, warmup=2, repeat=5)


def compiled_graphs() -> int:
    """Graphs torch.compile has made so far in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def fixed_batch(batch: int, seq_len: int, vocab: int, device: str, generator) -> dict:
    import torch

    ids = torch.randint(5, vocab, (batch, seq_len), generator=generator)
    mask = torch.ones_like(ids)
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "labels": mlm_labels(ids, mask, generator).to(device),
    }


def padded_batches(lengths, batch: int, vocab: int, device: str, generator) -> list:
    """Documents of the given lengths in batches of `batch`, right-padded to each batch's longest."""
    import torch

    batches = []
    for start in range(0, len(lengths), batch):
        chunk = lengths[start : start + batch]
        ids = torch.zeros(len(chunk), max(chunk), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, length in enumerate(chunk):
            ids[row, :length] = torch.randint(5, vocab, (length,), generator=generator)
            mask[row, :length] = 1
        batches.append(
            {
                "input_ids": ids.to(device),
                "attention_mask": mask.to(device),
                "labels": mlm_labels(ids, mask, generator).to(device),
            }
        )
    return batches


def packed_batches(lengths, rows: int, seq_len: int, vocab: int, device: str, generator) -> list:
    """The same documents packed greedily into rows of `seq_len` (``position_ids`` restarting at 0 per document,
    padding after the last document of a row), `rows` rows per batch."""
    import torch

    packed_rows, current = [], []
    for length in lengths:
        if sum(current) + length > seq_len:
            packed_rows.append(current)
            current = []
        current.append(length)
    packed_rows.append(current)
    batches = []
    for start in range(0, len(packed_rows), rows):
        chunk = packed_rows[start : start + rows]
        ids = torch.zeros(len(chunk), seq_len, dtype=torch.long)
        mask, positions = torch.zeros_like(ids), torch.zeros_like(ids)
        for row, documents in enumerate(chunk):
            used = sum(documents)
            ids[row, :used] = torch.randint(5, vocab, (used,), generator=generator)
            mask[row, :used] = 1
            positions[row, :used] = torch.cat([torch.arange(n) for n in documents])
        batches.append(
            {
                "input_ids": ids.to(device),
                "attention_mask": mask.to(device),
                "position_ids": positions.to(device),
                "labels": mlm_labels(ids, mask, generator).to(device),
            }
        )
    # A short last batch would be one more shape to compile: keep full batches only (the rate is per token).
    return batches[:-1] if len(batches) > 1 and len(batches[-1]["input_ids"]) < rows else batches


def time_batches(model, batches, device, warmup: int) -> float:
    """Seconds for one pass over `batches` (one training step each, CUDA events around each), after `warmup` steps
    on the first and one untimed pass over all (which compiles every shape the pass needs)."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
    steps = [train_step_fn(model, batch, device, optimizer) for batch in batches]
    for _ in range(warmup):
        steps[0]()
    for step in steps[1:]:
        step()
    return sum(common.median_ms(step, device, warmup=0, repeat=1) for step in steps) / 1e3


def real_lengths(context, source: str, seq_len: int, count: int) -> list:
    """Token lengths of real documents, cut at `seq_len`: UniProt residues + 2 specials, or SST-2 words + 2 (a
    word-level count; subword tokenizers give somewhat more)."""
    if source == "uniprot":
        lengths = []
        with gzip.open(context.data_file("proteins", "uniprot_sample_20k.fasta.gz"), "rt") as handle:
            length = None
            for line in handle:
                if line.startswith(">"):
                    if length:
                        lengths.append(length)
                    length = 0
                else:
                    length += len(line.strip())
                if len(lengths) >= count:
                    break
        return [min(seq_len, n + 2) for n in lengths[:count]]
    path = context.data_file("glue", "SST-2", "train.tsv")
    sentences = path.read_text(encoding="utf-8").splitlines()[1 : count + 1]
    return [min(seq_len, len(line.split("\t")[0].split()) + 2) for line in sentences]


def bench_models(context, table, budget_end: float) -> None:
    import torch

    generator = torch.Generator().manual_seed(0)
    tokens_per_step = 512 if context.quick else 32768
    vocab = model_sizes(context.quick)["vocab"]
    names = {None: "fixed L={}", "uniprot": "UniProt at {}", "sst2": "SST-2 at {}"}
    if context.quick:
        workloads = [(None, 64), (None, 128), ("uniprot", 128), ("sst2", 32)]
    else:  # the targets' workloads first (compiled at 1024 x 32, packed UniProt rows), so that a section cut short
        # by its time budget, each compiled kernel costing its compilation, has measured them
        workloads = [(None, 1024), ("uniprot", 1024), (None, 512), (None, 4096), ("sst2", 128)]
    workloads = [(names[source].format(seq_len), seq_len, source) for source, seq_len in workloads]
    models = build_models(context, max(seq_len for _, seq_len, _ in workloads) * 2)
    packing = common.packing_available()
    parameters = {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}
    for workload, seq_len, source in workloads:
        if context.clock() > budget_end:
            table.add(workload=workload, note="skipped: time budget spent")
            continue
        rows = max(1, tokens_per_step // seq_len)
        if source is None:
            shared = [fixed_batch(rows, seq_len, vocab, context.device, generator)] * (2 if context.quick else 5)
            lengths = None
        else:
            lengths = real_lengths(context, source, seq_len, rows * (2 if context.quick else 8))
        base_rate = None
        for name, model in models.items():
            packed = name == "DTA-BERT" and packing and lengths is not None
            if lengths is None:
                batches = shared
            elif packed:
                batches = packed_batches(lengths, rows, seq_len, vocab, context.device, generator)
            else:
                batches = padded_batches(lengths, rows, vocab, context.device, generator)
            arms = dta_arms(context, packed) if name == "DTA-BERT" else [("sdpa", False)]
            for implementation, compiled in arms:
                if context.clock() > budget_end:
                    table.add(
                        workload=workload, model=name, implementation=implementation, note="skipped: time budget spent"
                    )
                    continue
                row = time_arm(context, model, implementation, compiled, batches)
                base_rate = row.get("useful_tokens_per_s") if name == "ModernBERT" else base_rate
                table.add(
                    workload=workload,
                    model=name,
                    params_m=parameters[name] / 1e6,
                    batching="packed" if packed else ("fixed" if lengths is None else "padded"),
                    **row,
                )
        for row in table.rows:
            if row["workload"] == workload and base_rate and row.get("useful_tokens_per_s") not in ("", None):
                row["x ModernBERT"] = row["useful_tokens_per_s"] / base_rate


def time_arm(context, model, implementation: str, compiled: bool, batches: list) -> dict:
    """The table cells of one model x kernel over `batches`: its rate, peak memory, and for DTA-BERT the attention
    inputs' build time and the graphs compiling made; or a note where it failed."""
    import torch

    model.set_attn_implementation(implementation)
    # dynamic=False: each length its own graph. Dynamo would otherwise turn the length symbolic at the second
    # workload, and Inductor 2.11 cannot split flex's block-rounded symbolic length.
    runner = torch.compile(model, dynamic=False) if compiled else model
    label = implementation + (" + compile" if compiled else "")
    graphs_before = compiled_graphs()
    common.reset_peak_memory(context.device)
    try:
        seconds = time_batches(runner, batches, context.device, warmup=1 if context.quick else 3)
    except torch.OutOfMemoryError:
        return dict(implementation=label, note="out of memory")
    except Exception as error:  # a model that fails here is a row of the table, not the end of the run
        return dict(implementation=label, note=common.error_note(error))
    row = dict(
        implementation=label,
        useful_tokens_per_s=sum(int(b["attention_mask"].sum()) for b in batches) / seconds,
        peak_gib=common.peak_memory_gib(context.device),
    )
    if hasattr(model.config, "attention_type"):  # encoderlab's own
        row["mask_ms"] = mask_build_ms(model, batches[0], context.device)
        row["graphs"] = compiled_graphs() - graphs_before if compiled else ""
    return row


def homa_arms(context, windows) -> list:
    """(label, attention type, window, fused): the baselines, HOMA at every window with the kernel the device runs,
    and, on a GPU with Triton, HOMA at the smallest and largest window with the torch kernel (GPU-sized tiles)."""
    from encoderlab.modeling.kernels import triadic

    fused = context.on_gpu and triadic.TRITON_AVAILABLE
    arms = [("pairwise", "pairwise", windows[0], fused), ("Blockwise-2D", "blockwise", windows[0], fused)]
    arms += [(f"HOMA w={w}", "homa", w, fused) for w in windows]
    if fused:
        arms += [(f"HOMA w={w}", "homa", w, False) for w in (windows[0], windows[-1])]
    return arms


def bench_homa(context, table) -> None:
    import torch

    from encoderlab import HOMAConfig, HOMAForTokenClassification
    from encoderlab.modeling.kernels import triadic

    if context.quick:
        shape = dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            block_size=8,
            block_stride=4,
            u_rank=4,
            fusion_hidden_size=16,
        )
        batch, seq_len, windows = 2, 64, (3, 5)
    else:  # the paper's secondary-structure model (Table 1)
        shape = dict(
            hidden_size=512,
            num_hidden_layers=12,
            num_attention_heads=8,
            intermediate_size=1024,
            block_size=30,
            block_stride=15,
            u_rank=8,
            fusion_hidden_size=128,
        )
        batch, seq_len, windows = 16, 512, (3, 5, 7)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 25, (batch, seq_len), generator=generator)
    inputs = {
        "input_ids": ids.to(context.device),
        "attention_mask": torch.ones_like(ids).to(context.device),
        "labels": torch.randint(0, 3, (batch, seq_len), generator=generator).to(context.device),
    }
    base, fused_default = None, triadic.FUSED_ON_CUDA
    for label, attention_type, window, fused in homa_arms(context, windows):
        kernel = ("fused Triton" if fused else "torch") if attention_type == "homa" else ""
        model = (
            HOMAForTokenClassification(
                HOMAConfig(
                    vocab_size=30,
                    num_labels=3,
                    max_position_embeddings=seq_len,
                    attention_type=attention_type,
                    triadic_window=window,
                    hidden_dropout_prob=0.0,
                    **shape,
                )
            )
            .to(context.device)
            .train()
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        common.reset_peak_memory(context.device)
        triadic.FUSED_ON_CUDA = fused
        try:
            ms = common.median_ms(
                train_step_fn(model, inputs, context.device, optimizer),
                context.device,
                warmup=1 if context.quick else 3,
                repeat=2 if context.quick else 10,
            )
        except torch.OutOfMemoryError:
            table.add(arm=label, kernel=kernel, note="out of memory")
            continue
        finally:
            triadic.FUSED_ON_CUDA = fused_default
        rate = batch * seq_len / (ms * 1e-3)
        base = rate if attention_type == "blockwise" else base
        paper = HOMA_PAPER_A100.get(window) if attention_type == "homa" else None
        peak = common.peak_memory_gib(context.device)
        table.add(
            arm=label,
            kernel=kernel,
            ms_per_step=ms,
            token_positions_per_s=rate,
            peak_gib=peak,
            **{
                "x Blockwise-2D": rate / base if base else "",
                "x paper A100": rate / paper[0] if paper and context.on_gpu else "",
                "memory / paper": peak * 2**30 / 1e9 / paper[1] if paper and context.on_gpu else "",
            },
        )
        del model, optimizer


def bench_memory(context, table, budget_end: float) -> None:
    """Largest batch (doubling) whose training step fits at L = 4096, uncompiled."""
    import torch

    seq_len = 128 if context.quick else 4096
    cap = 4 if context.quick else 512
    vocab = model_sizes(context.quick)["vocab"]
    generator = torch.Generator().manual_seed(0)
    for name, model in build_models(context, seq_len, names=("DTA-BERT", "ModernBERT")).items():
        if name == "DTA-BERT":
            model.set_attn_implementation("flex_attention" if context.on_gpu else "sdpa")
        largest, peak, batch, note = 0, float("nan"), 1, "cap reached"
        while batch <= cap:
            if context.clock() >= budget_end:
                note = "time budget spent"
                break
            common.reset_peak_memory(context.device)
            try:
                time_batches(
                    model, [fixed_batch(batch, seq_len, vocab, context.device, generator)], context.device, warmup=1
                )
            except torch.OutOfMemoryError:
                note = ""
                break
            largest, peak, batch = batch, common.peak_memory_gib(context.device), batch * 2
        table.add(model=name, L=seq_len, largest_batch=largest, peak_gib_at_largest=peak, note=note)
        del model
        common.reset_peak_memory(context.device)


def profile_dta(context) -> dict:
    """DTA-BERT steps at L = 4096 under torch.profiler (compiled flex_attention as in the model section)."""
    import torch

    seq_len, batch = (64, 2) if context.quick else (4096, 8)
    model = build_models(context, seq_len, names=("DTA-BERT",))["DTA-BERT"]
    model.set_attn_implementation("flex_attention" if context.on_gpu else "sdpa")
    runner = torch.compile(model, dynamic=False) if context.on_gpu and context.compile else model
    inputs = fixed_batch(
        batch, seq_len, model_sizes(context.quick)["vocab"], context.device, torch.Generator().manual_seed(0)
    )
    table, numbers = throughput_report.profile_step(context, runner, inputs)
    (context.out / "throughput_profile.txt").write_text(
        f"DTA-BERT training step, L={seq_len}, batch {batch}, {numbers}\n\n{table}\n", encoding="utf-8"
    )
    return numbers


def main(argv=None, clock: Callable[[], float] = time.monotonic) -> int:
    """The command line; `clock` is what the time budget is read from (the tests' own step clock)."""
    arguments = common.parser(__doc__.splitlines()[0], gpu_minutes=6)
    arguments.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    arguments.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="DTA-BERT without torch.compile in the model section (when compiling runs too long)",
    )
    args = arguments.parse_args(argv)
    context = common.start(args, clock)
    context.compile = args.compile
    common.raise_recompile_limit()
    implementations = [
        i
        for i in common.attention_implementations()
        if i != "eager" and (context.on_gpu or i not in ("varlen", "flex_attention"))
    ]
    tables = {
        "attention": common.Table(
            "attention op, fwd + bwd",
            ["L", "batch", "attention", "implementation", "ms", "tflops", "of ceiling", "ms / bidirectional", "note"],
        ),
        "homa": common.Table(
            "HOMA at the paper's SS shape",
            [
                "arm",
                "kernel",
                "ms_per_step",
                "token_positions_per_s",
                "peak_gib",
                "x Blockwise-2D",
                "x paper A100",
                "memory / paper",
                "note",
            ],
        ),
        "models": common.Table(
            "MLM train step",
            [
                "workload",
                "model",
                "params_m",
                "batching",
                "implementation",
                "useful_tokens_per_s",
                "x ModernBERT",
                "peak_gib",
                "mask_ms",
                "graphs",
                "note",
            ],
        ),
        "memory": common.Table("largest batch", ["model", "L", "largest_batch", "peak_gib_at_largest", "note"]),
    }
    ceiling = float("nan")
    share = {"ceiling": 0.02, "attention": 0.27, "homa": 0.13, "models": 0.38, "memory": 0.14, "profile": 0.06}
    profile, failures, skipped = {}, {}, []
    for index, section in enumerate(args.sections):
        left = context.seconds_left()
        print(f"--- {section} ({left:.0f} s left)", flush=True)
        if left <= 0:
            print(f"skipped {section}: time budget spent")
            skipped.append(section)
            continue
        # This section's share of the time left, among the sections still to run.
        end = context.clock() + left * share[section] / sum(share[s] for s in args.sections[index:])
        try:
            if section == "ceiling":
                ceiling = common.matmul_ceiling_tflops(context.device, context.quick)
                print(
                    f"bf16 matmul ceiling: {ceiling:.1f} TFLOP/s"
                    if context.on_gpu
                    else f"fp32 matmul rate: {ceiling:.3f} TFLOP/s"
                )
            elif section == "attention":
                bench_attention(context, tables["attention"], implementations, end, ceiling)
            elif section == "homa":
                bench_homa(context, tables["homa"])
            elif section == "models":
                bench_models(context, tables["models"], end)
            elif section == "memory":
                bench_memory(context, tables["memory"], end)
            else:
                profile = profile_dta(context)
        except Exception as error:  # one section's failure is reported; the sections after it still run
            failures[section] = common.error_note(error)
            print(f"section {section} failed: {failures[section]}", flush=True)
        for name, table in tables.items():  # after every section, so that a run stopped at its limit keeps them
            if table.rows:
                table.write_csv(context.out / f"throughput_{name}.csv")
    for table in tables.values():
        if table.rows:
            print(table.text())
    goals = throughput_report.targets(tables, long_from=128 if context.quick else 4096)
    print(goals.text())
    common.write_json(
        context.out / "throughput_summary.json",
        {
            "device": common.device_name(context.device),
            "versions": common.versions(),
            "matmul_ceiling_tflops": ceiling,
            "targets": goals.rows,
            "profile": profile,
            "failed_sections": failures,
            "skipped_sections": skipped,
            "command": " ".join(sys.argv),
            "seconds": round(context.elapsed(), 1),
        },
    )
    print(f"matmul ceiling {ceiling:.1f} TFLOP/s; profile {profile}; {context.elapsed():.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
