"""``ptrain tune``: every speed-up the installed plugins offer, measured on the user's own model
and data, and the configuration that wins written back as a config file.

Plugins offer :class:`Candidate` objects through the ``tune_candidates`` hook;
:mod:`ptrain.tuning.trial` runs one measured trial, :mod:`ptrain.tuning.search` interleaves
them with the baseline and combines the winners, :mod:`ptrain.tuning.run` drives a whole tune.
This module imports no torch.
"""

from ptrain.tuning.candidates import Candidate, RunConfig, precision_candidate

__all__ = ["Candidate", "RunConfig", "precision_candidate"]
