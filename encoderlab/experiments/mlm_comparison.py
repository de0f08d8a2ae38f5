"""The MLM comparison's former module name: ``encoderlab.experiments.mlm_comparison`` is
`encoderlab.experiments.mlm.training`, the same module object, so that code importing the old name gets the sweep
(and a test that patches ``mlm_comparison.train_arm`` patches the function the sweep calls). New code imports from
`encoderlab.experiments.mlm`."""

import sys

from .mlm import training

sys.modules[__name__] = training
