"""ptrain on Google TPUs through torch_xla: the ``tpu`` accelerator and the ``xla`` strategy.

Nothing here imports torch_xla until a run selects the plugin: listing and availability checks
look for the package and the device files only (see :func:`ptrain_xla.accelerator.tpu_problem`).
"""
