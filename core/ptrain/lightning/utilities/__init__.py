"""``lightning.pytorch.utilities``' names over ptrain. Each is ptrain's own implementation of
what Lightning's does (see each module), and Lightning's deeper modules that programs import
from are here at the same paths: ``types``, ``rank_zero``, ``seed``, ``exceptions``,
``model_summary``, ``combined_loader``, ``parsing``, ``enums``, ``grads``,
``parameter_tying``, ``warnings``."""

import torch

from ptrain.lightning.utilities.combined_loader import CombinedLoader
from ptrain.lightning.utilities.enums import GradClipAlgorithmType, LightningEnum
from ptrain.lightning.utilities.filesystem import is_shared_filesystem
from ptrain.lightning.utilities.flops import measure_flops
from ptrain.lightning.utilities.grads import grad_norm
from ptrain.lightning.utilities.parameter_tying import (find_shared_parameters,
                                                        set_shared_parameters)
from ptrain.lightning.utilities.parsing import AttributeDict, is_picklable
from ptrain.lightning.utilities.rank_zero import (rank_zero_deprecation, rank_zero_info,
                                                  rank_zero_only, rank_zero_warn)
from ptrain.lightning.utilities.transfer import move_data_to_device
from ptrain.lightning.utilities.warnings import disable_possible_user_warnings
from ptrain.lightning.utilities.workers import suggested_max_num_workers

__all__ = [
    "AttributeDict", "CombinedLoader", "disable_possible_user_warnings", "find_shared_parameters",
    "grad_norm", "GradClipAlgorithmType", "is_picklable", "is_shared_filesystem", "LightningEnum",
    "measure_flops", "move_data_to_device", "rank_zero_deprecation", "rank_zero_info",
    "rank_zero_only", "rank_zero_warn", "set_shared_parameters", "suggested_max_num_workers",
]

#: the spacing between 1 and the next number each float format can hold
FLOAT16_EPSILON = torch.finfo(torch.float16).eps
FLOAT32_EPSILON = torch.finfo(torch.float32).eps
FLOAT64_EPSILON = torch.finfo(torch.float64).eps


#: modules here that Lightning's package has imported once it is (``pl.utilities.types.X``,
#: ``pl.utilities.model_summary.ModelSummary`` after ``import lightning.pytorch as pl`` alone)
_SUBMODULES = ("exceptions", "imports", "model_helpers", "model_summary", "types")


def __getattr__(name: str):
    from ptrain.lightning._common import submodule

    return submodule(__name__, name, _SUBMODULES)
