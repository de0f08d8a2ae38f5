"""``encoderlab convert-routing CHECKPOINT --routing ROUTING --out FOLDER``: a saved DTA-BERT model with its weights
permuted to the other dual-triangle head routing (`encoderlab.modeling.convert`), saved with its tokenizer."""

from pathlib import Path

from .configuration.choices import DUAL_TRIANGLE_ROUTINGS

# Imported inside functions (cost): torch, transformers and the model's modules, so that --help and check() answer
# without them (encoderlab/cli.py).


def add_arguments(parser):
    parser.add_argument("checkpoint", type=Path, help="a saved DTA-BERT folder (save_pretrained)")
    parser.add_argument("--routing", required=True, choices=DUAL_TRIANGLE_ROUTINGS, help="the routing to convert to")
    parser.add_argument("--out", type=Path, required=True, help="folder for the converted model (and tokenizer)")


def check_saved_model(path):
    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json: give a folder written by save_pretrained")


def check(args):
    check_saved_model(args.checkpoint)
    if args.out.exists() and any(args.out.iterdir()):
        raise FileExistsError(f"--out {args.out} is not empty; choose a new folder")


def load_checkpoint(path):
    """The DTA-BERT model saved in `path`, as the class it was saved from (``config.architectures``)."""
    from transformers import AutoConfig

    from .configuration.dta import DTABertConfig
    from .modeling.dta import DTA_AUTO_CLASSES

    check_saved_model(path)
    config = AutoConfig.from_pretrained(path)
    architecture = (config.architectures or ["DTABertModel"])[0]
    classes = {model_class.__name__: model_class for model_class in DTA_AUTO_CLASSES.values()}
    if not isinstance(config, DTABertConfig) or architecture not in classes:
        raise ValueError(
            f"{path} holds a {config.model_type} model ({architecture}); the head routing is a "
            "DTA-BERT option (dta_bert)"
        )
    return classes[architecture].from_pretrained(path)


def run(args):
    from transformers import AutoTokenizer

    from .modeling.convert import convert_routing

    check(args)
    convert_routing(load_checkpoint(args.checkpoint), args.routing).save_pretrained(args.out)
    if any(args.checkpoint.glob("tokenizer*")):
        AutoTokenizer.from_pretrained(args.checkpoint).save_pretrained(args.out)
    print(f"wrote {args.out} (dual_triangle_routing={args.routing!r})")
    return 0
