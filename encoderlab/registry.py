"""Which model classes each family offers for which transformers Auto class, and their registration."""

import transformers

FAMILIES = {}  # config class -> {"AutoModel": cls, "AutoModelForMaskedLM": cls, ...}


def register_family(config_class, model_classes):
    """Registers a family with ``AutoConfig`` and the given Auto model classes (idempotent)."""
    if config_class in FAMILIES:
        return
    transformers.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    for auto_name, model_class in model_classes.items():
        getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
    FAMILIES[config_class] = dict(model_classes)
