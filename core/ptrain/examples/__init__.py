"""Examples that ship with ptrain-core, each a model module and a config to train it with.

``ptrain example`` lists them; ``ptrain example NAME [fit options]`` trains one (``ptrain fit
--config`` with the example's config, which the options override; a ``--config`` of one's own is
refused, since config files are not layered). Their data comes from
scikit-learn, installed by the ``examples`` extra: ``pip install "ptrain-core[examples]"``.
"""

#: example name -> what it trains
EXAMPLES = {
    "digits": "an MLP on scikit-learn's 8x8 handwritten digits (about 97% validation accuracy "
              "in 10 epochs, seconds on a CPU)",
}


def config_path(name: str) -> str:
    """The path of example ``name``'s config file (``ptrain fit --config`` reads it), or a
    :class:`ptrain.ConfigError` naming the examples there are."""
    from importlib import resources

    from ptrain.errors import ConfigError
    from ptrain.options import closest

    if name not in EXAMPLES:
        raise ConfigError(f"no example called {name!r}; the examples are: "
                          f"{', '.join(EXAMPLES)}.{closest(name, EXAMPLES)} `ptrain example` "
                          f"lists them with what each trains.")
    return str(resources.files(__name__) / f"{name}.toml")
