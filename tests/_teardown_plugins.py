"""Callbacks for the teardown tests (``-p tests._teardown_plugins:FailsInTeardown``)."""

from __future__ import annotations

import ptrain


class FailsInTeardown:
    """Its ``teardown`` raises, as a plugin with a bug there would."""

    @ptrain.hookimpl
    def teardown(self, trainer):
        raise OSError("the upload service refused the connection")


class RecordsTeardown:
    """Appends the stage to ``released`` in its ``teardown`` (a wrapper implementation: its code
    after the ``yield`` runs too)."""

    def __init__(self):
        self.released: list[str] = []

    @ptrain.hookimpl(wrapper=True)
    def teardown(self, trainer, stage):
        self.released.append(f"{stage} before")
        yield
        self.released.append(f"{stage} after")
