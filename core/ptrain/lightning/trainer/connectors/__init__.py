"""``lightning.pytorch.trainer.connectors``: the one private module programs import from (see
:mod:`.accelerator_connector`)."""
