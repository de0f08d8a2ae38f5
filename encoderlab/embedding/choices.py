"""The values the options of ``encoderlab embed`` take, in a module without heavy imports: the command line offers
them before torch is loaded, and the modules that act on them import them from here."""

from ..configuration.choices import ATTENTION_IMPLEMENTATIONS

POOLINGS = ("mean", "cls", "max")
STORAGE_DTYPES = ("float32", "float16", "bfloat16")
LONG_CHOICES = ("error", "truncate", "windows")
GAPS_CHOICES = ("error", "remove")
UNKNOWN_RESIDUES_CHOICES = ("error", "allow")
INPUT_KINDS = ("fasta", "csv", "tsv", "jsonl", "text", "hub")
PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_KERNELS = ATTENTION_IMPLEMENTATIONS
